"""`agentrl runs list|show`: the run directories and what they hold."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from agentrl_cli.cli.commands.common import ConfigOpt, JsonOpt, SetOpt, load, out, print_json
from agentrl_cli.cli.render import status_text
from agentrl_cli.core.report import CheckStatus
from agentrl_cli.core.rundir import RunDir, get_run, list_runs

app = typer.Typer(help="List and inspect runs (runs/<run_id>/).", no_args_is_help=True)


def _summary(run: RunDir) -> dict:
    meta = run.meta()
    reports = run.stage_reports()
    return {"run_id": run.run_id, "path": str(run.path), "created_at": meta.get("created_at"),
            "config_hash": meta.get("config_hash"), "config_source": meta.get("config_source"),
            "stages": {str(n): r.status for n, r in sorted(reports.items())}}


@app.command("list")
def list_command(config: ConfigOpt = None, sets: SetOpt = None, json_out: JsonOpt = False) -> None:
    """List runs, newest first, with each stage's status.

    Examples:

    * `agentrl runs list`

    * `agentrl runs list --json`
    """
    loaded = load(config, sets)
    runs = [_summary(r) for r in list_runs(Path(loaded.config.observe.runs_dir))]
    if json_out:
        print_json(runs)
        return
    table = Table("run", "created", "config", "stages")
    for r in runs:
        table.add_row(r["run_id"], r["created_at"] or "?", r["config_hash"] or "?",
                      " ".join(f"{n}:{s}" for n, s in r["stages"].items()) or "-")
    out().print(table)
    if not runs:
        typer.echo(f"no runs under {loaded.config.observe.runs_dir}; start one with `agentrl stage run all`", err=True)


@app.command("show")
def show(run: Annotated[str, typer.Argument(help="Run id, or `latest`.")] = "latest",
         config: ConfigOpt = None, sets: SetOpt = None, json_out: JsonOpt = False) -> None:
    """Show a run: its metadata (config hash, packages, host, seeds, harness versions) and stage results.

    Examples:

    * `agentrl runs show latest`

    * `agentrl runs show 20261129-101500-ab12cd --json`
    """
    loaded = load(config, sets)
    r = get_run(Path(loaded.config.observe.runs_dir), run)
    meta = r.meta()
    reports = r.stage_reports()
    if json_out:
        print_json({"meta": meta, "reports": {str(n): rep.to_dict() for n, rep in sorted(reports.items())}})
        return
    console = out()
    console.print(f"run {r.run_id}  ({r.path})")
    console.print(f"created {meta.get('created_at')}  config {meta.get('config_hash')} from {meta.get('config_source')}")
    console.print(f"seeds {meta.get('seeds')}  task set {meta.get('task_set_version')}")
    console.print("harnesses: " + ", ".join(f"{h['name']}@{h['version']} ({h['image_tag']})" for h in meta.get("harnesses", [])))
    pk = meta.get("packages", {})
    console.print("packages: " + ", ".join(f"{k} {v}" for k, v in pk.items() if v))
    shown = (CheckStatus.PASS, CheckStatus.FAIL, CheckStatus.SKIP)
    table = Table("stage", "title", "status", *(s.value for s in shown), "seconds")
    for n, rep in sorted(reports.items()):
        c = rep.counts()
        table.add_row(str(n), rep.title, status_text(rep.status), *(str(c[s]) for s in shown), f"{rep.duration_s:.1f}")
    console.print(table)
