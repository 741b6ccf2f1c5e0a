"""`agentrl engine verify`: hold agentrl's requests to an inference engine against the engine's own
code (its argument parser, route table, request and response models), and record a pass."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from agentrl_cli.cli.commands.common import ConfigOpt, JsonOpt, SetOpt, checks_json, finish, load, out, print_json
from agentrl_cli.cli.render import render_checks

app = typer.Typer(help="Check agentrl's requests against an inference engine's own code.", no_args_is_help=True)


@app.command("verify")
def verify_cmd(
    engine: Annotated[Optional[str], typer.Option("--engine", help="sglang or vllm (default inference.engine).", show_default=False)] = None,
    python: Annotated[Optional[str], typer.Option("--python", help="The interpreter of the engine's environment (default inference.python).", show_default=False)] = None,
    config: ConfigOpt = None,
    sets: SetOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Check the launch command, every route, request body and query agentrl sends, and every answer
    field it reads, against the engine installed for --python: its own argument parser, route table
    and request/response models (imported where they import on this machine, else read from the
    installed package's source; each item says which). A pass is recorded, so `agentrl image lock`
    lists the version and stage 4 stops reporting it as unverified. Exit 1 when a check fails.

    Examples:

    * `agentrl engine verify --engine vllm --python /opt/vllm/bin/python`

    * `bash scripts/engine-venvs.sh && agentrl engine verify --engine sglang --python ~/.cache/agentrl/engines/sglang-0.5.23/bin/python --json`
    """
    from agentrl_cli.core.errors import UsageError
    from agentrl_cli.engines.conformance.check import probe_kind, verify
    from agentrl_cli.engines.conformance.record import conformance_check, record_pass, version_check
    from agentrl_cli.engines.registry import engine_for

    cfg = load(config, [*(sets or []), *([f"inference.engine={engine}"] if engine else [])]).config
    chosen = engine_for(cfg)
    try:
        probe_kind(chosen)
    except ValueError as exc:
        raise UsageError(str(exc), "use --engine sglang or --engine vllm") from None
    result = verify(chosen, cfg, python)
    checks = [conformance_check(result), version_check(result.engine, result.version, result.python, cfg.model.cache_dir)]
    recorded = str(record_pass(result, cfg.model.cache_dir)) if result.passed else None
    if recorded:
        checks[1] = version_check(result.engine, result.version, result.python, cfg.model.cache_dir)
    if json_out:
        print_json(checks_json(checks, engine=result.engine, version=result.version, python=result.python,
                               read=result.paths, recorded=recorded, items=result.items))
    else:
        render_checks(out(), checks, f"{result.engine} {result.version} ({result.python}; read: {result.paths})")
        if recorded:
            out().print(f"recorded in {recorded}")
    finish(checks)
