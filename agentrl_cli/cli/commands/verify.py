"""`agentrl verify`: the four-layer acceptance plus the cross-harness check."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from agentrl_cli.cli.commands.common import ConfigOpt, JsonOpt, RunOpt, SetOpt, err, load, out, print_json
from agentrl_cli.core.errors import NotFoundError, UsageError
from agentrl_cli.cli.render import render_checks
from agentrl_cli.core.report import CheckStatus
from agentrl_cli.acceptance.run_meta import create_run
from agentrl_cli.core.rundir import get_run
from agentrl_cli.acceptance.verify import LAYERS, verify
from agentrl_cli.acceptance.verify.core import LAYER_KEYS, write_verify_report


def verify_command(
    config: ConfigOpt = None,
    sets: SetOpt = None,
    run: RunOpt = None,
    layer: Annotated[Optional[list[str]], typer.Option(
        "--layer", help=f"Only this layer (repeatable): {', '.join(LAYER_KEYS)}.", show_default=False)] = None,
    record_only: Annotated[bool, typer.Option(
        "--record-only", help="Judge only what the run recorded; start no verification run and no baseline loop "
                              "(connectivity still probes).")] = False,
    strict: Annotated[bool, typer.Option("--strict", help="Treat skipped checks as failures.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Four-layer acceptance: connectivity, correctness, performance vs the stage-0 baseline,
    small-sample convergence, and cross-harness. Reads what the run recorded and measures what is
    missing: with no training to judge it runs a short verification run itself (the stage 8 short
    recipe, bounded by verify.minutes) and says so. Writes reports/verify.{json,md}; exit 0 pass,
    1 a check failed, 2 bad usage.

    Examples:

    * `agentrl verify` (the newest run, or a new one)

    * `agentrl verify --run 20261129-101500-ab12cd --json`

    * `agentrl verify --layer connectivity --layer performance`

    * `agentrl verify --record-only --strict`
    """
    bad = [x for x in layer or [] if x not in LAYER_KEYS]
    if bad:
        raise UsageError(f"unknown --layer {', '.join(bad)}", f"use one of: {', '.join(LAYER_KEYS)}")
    loaded = load(config, sets)
    try:
        run_dir = get_run(Path(loaded.config.observe.runs_dir), run)
    except NotFoundError:
        if run:
            raise
        run_dir = create_run(loaded)
    with err().status("verify") as status:
        report = verify(loaded, run_dir, layers=layer or None, strict=strict, measure=not record_only,
                        progress=lambda m: status.update(f"verify: {m}"))
    write_verify_report(report, run_dir.reports)
    from agentrl_cli.acceptance.run_report import report_or_reason

    html, html_error = report_or_reason(run_dir.path, loaded.config.data)
    if json_out:
        print_json({**report.to_dict(), "run_dir": str(run_dir.path), "report": html})
    else:
        console = out()
        layers = {lay.key: report.layers[lay.key] for lay in LAYERS if lay.key in report.layers}
        render_checks(console, layers, f"agentrl verify (run {run_dir.run_id})", group="layer")
        console.print(f"judged: {report.judged}")
        for note in report.notes:
            console.print(f"  note: {note}", style="yellow")
        console.print(f"Report: {run_dir.reports / 'verify.md'}")
        if report.status == CheckStatus.FAIL:
            console.print(f"Diagnose: agentrl troubleshoot --run {run_dir.run_id}")
    err().print(f"Run report: {html}  (`agentrl report {run_dir.run_id} --open`)" if html else f"Run report not written: {html_error}",
                soft_wrap=True)
    raise typer.Exit(1 if report.status == CheckStatus.FAIL else 0)
