"""`agentrl verify`: the four-layer acceptance plus the cross-harness check."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from agentrl_cli.commands.common import ConfigOpt, JsonOpt, RunOpt, SetOpt, err, load, out, print_json
from agentrl_cli.errors import NotFoundError
from agentrl_cli.render import status_text
from agentrl_cli.report import FAIL, atomic_write_text, format_measured
from agentrl_cli.rundir import create_run, get_run
from agentrl_cli.verify import LAYERS, verify


def verify_command(
    config: ConfigOpt = None,
    sets: SetOpt = None,
    run: RunOpt = None,
    strict: Annotated[bool, typer.Option("--strict", help="Treat skipped checks as failures.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Four-layer acceptance: connectivity, correctness, performance vs the stage-0 baseline,
    small-sample convergence, and cross-harness. Writes reports/verify.{json,md}; exit 0 pass, 1 fail.

    Examples:

    * `agentrl verify` (the newest run, or a new one)

    * `agentrl verify --run 20261129-101500-ab12cd --json`
    """
    loaded = load(config, sets)
    try:
        run_dir = get_run(Path(loaded.config.observe.runs_dir), run)
    except NotFoundError:
        if run:
            raise
        run_dir = create_run(loaded)
    with err().status("verify") as status:
        report = verify(loaded, run_dir, strict=strict, progress=lambda m: status.update(f"verify: {m}"))
    atomic_write_text(run_dir.reports / "verify.json", json.dumps(report.to_dict(), indent=2, default=str) + "\n")
    atomic_write_text(run_dir.reports / "verify.md", report.to_markdown())
    if json_out:
        print_json({**report.to_dict(), "run_dir": str(run_dir.path)})
    else:
        console = out()
        table = Table("layer", "check", "status", "measured", "expected", title=f"agentrl verify (run {run_dir.run_id})")
        for layer in LAYERS:
            for c in report.layers[layer.key]:
                table.add_row(layer.title, c.name, status_text(c.status), format_measured(c.measured), c.expected)
        console.print(table)
        for c in report.checks():
            if c.status == FAIL:
                console.print(f"  ✗ {c.name}: what to do: {c.hint}", style="red")
        console.print(f"Report: {run_dir.reports / 'verify.md'}")
    raise typer.Exit(1 if report.status == FAIL else 0)
