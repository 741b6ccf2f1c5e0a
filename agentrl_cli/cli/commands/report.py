"""`agentrl report [RUN] [--open] [--json]`: write a run's self-contained HTML report and summarise it."""

from __future__ import annotations

import webbrowser
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from agentrl_cli.cli.commands.common import ConfigOpt, JsonOpt, SetOpt, err, load, out, print_json
from agentrl_cli.cli.render import print_table


def report_command(
    run: Annotated[Optional[str], typer.Argument(help="Run id (default: the newest run).", show_default=False)] = None,
    open_it: Annotated[bool, typer.Option("--open", help="Open the report in a web browser.")] = False,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write the HTML here (default: RUN_DIR/report.html).",
                                                   dir_okay=False, show_default=False)] = None,
    config: ConfigOpt = None, sets: SetOpt = None, json_out: JsonOpt = False,
) -> None:
    """Write a run's HTML report (plots, evaluation table, stage and verify reports) and summarise it.

    One self-contained file (figures embedded, no network needed to view it): reward and success by
    harness with the held-out harness beside them, phase time shares, latency histograms (generation,
    tool call, environment step), queue length and buffer fill, staleness drops, the evaluation
    metrics by harness and phase, and every stage and verify check with its hint.

    Examples:

    * `agentrl report`

    * `agentrl report 20261129-101500-ab12cd --open`

    * `agentrl report --json`
    """
    from agentrl_cli.runtime.observe import keys
    from agentrl_cli.acceptance.run_report import write_report
    from agentrl_cli.core.rundir import get_run

    loaded = load(config, sets)
    run_dir = get_run(Path(loaded.config.observe.runs_dir), run)
    path, data = write_report(run_dir.path, data_config=loaded.config.data, out=output)
    rows = data.step_rows()
    last = rows[-1] if rows else {}
    summary = {"run_id": data.run_id, "report": str(path), "metrics_from": data.main_log()[0] or None, "steps": len(rows),
               "reward_mean_last": last.get(keys.REWARD_MEAN), "goodput": last.get(keys.ROLLOUT_GOODPUT),
               "time_shares_last": {k: last.get(keys.time_share(k)) for k in ("sampling", "train", "sync")},
               "stages": {str(r.get("stage")): r.get("status") for r in data.stage_reports},
               "verify": (data.verify_report or {}).get("status"), "notes": data.notes}
    if json_out:
        print_json(summary)
    else:
        console = out()
        table = Table(title=f"Run {data.run_id}", title_justify="left")
        table.add_column("figure")
        table.add_column("value", overflow="fold")
        for key in ("metrics_from", "steps", "reward_mean_last", "goodput", "time_shares_last", "stages", "verify"):
            table.add_row(key, str(summary[key]))
        print_table(console, table)
        for row in data.eval_table:
            if row.get("harness") == "all":
                console.print(f"all trajectories: n={row.get('n')} success rate {row.get('success_rate')}")
        for note in data.notes:
            err().print(f"note: {note}")
        console.print(f"Report: {path}")
    if open_it:
        webbrowser.open(path.resolve().as_uri())
