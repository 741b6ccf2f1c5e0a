"""`agentrl data query|calls|metrics|gc|spool`: the trajectory store and its call log from the command line."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from agentrl_cli.cli.commands.common import ConfigOpt, JsonOpt, SetOpt, load, out, print_json
from agentrl_cli.core.errors import UsageError

app = typer.Typer(help="Query, measure and clean the trajectory store (data.store: local or s3).", no_args_is_help=True)


def _store(cfg):
    from agentrl_cli.runtime.data.stores import open_store

    return open_store(cfg.data)


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    return "-" if value is None else str(value)


@app.command("query")
def query(
    expression: Annotated[str, typer.Argument(help="Filter, e.g. \"tool_failures > 3 and turns > 50\".")] = "",
    run: Annotated[str, typer.Option("--run", help="Only this run id.")] = "",
    limit: Annotated[int, typer.Option("--limit", min=1, help="Rows shown.")] = 50,
    config: ConfigOpt = None,
    sets: SetOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """List trajectories matching a filter over the scalar columns (turns, tool_calls, tool_failures,
    invalid_actions, reward, outcome, harness, task_type, phase, run_id, date, ...).

    Examples:

    * `agentrl data query "tool_failures > 3 and turns > 50"`

    * `agentrl data query "outcome in ('timeout', 'error')" --run 20261129-101500-ab12cd --json`
    """
    from agentrl_cli.runtime.data.query import filter_table, parse_filter, summary_rows

    loaded = load(config, sets)
    text = " and ".join(p for p in (expression.strip() and f"({expression})", run and f"run_id == {run!r}") if p)
    expr = parse_filter(text) if text else None  # QueryError → exit 2 with the allowed columns
    table = _store(loaded.config).read_table()
    if expr is not None:
        table = filter_table(table, text)
    rows = summary_rows(table, limit=limit)
    if json_out:
        print_json({"matched": table.num_rows, "shown": len(rows), "rows": rows})
        return
    t = Table(*(rows[0].keys() if rows else ("trajectory_id",)))
    for r in rows:
        t.add_row(*(_fmt(v) for v in r.values()))
    out().print(t)
    typer.echo(f"{table.num_rows} matched, {len(rows)} shown", err=True)


CALL_COLUMNS = ("trajectory_id", "step", "tool", "status", "exit_code", "arguments", "output")  # the table; --json: every column


@app.command("calls")
def calls(
    task: Annotated[str, typer.Option("--task", help="Only calls of this task id.")] = "",
    trajectory: Annotated[str, typer.Option("--trajectory", help="Only calls of this trajectory id.")] = "",
    tool: Annotated[str, typer.Option("--tool", help="Only calls of this tool.")] = "",
    status: Annotated[str, typer.Option("--status", help="Only calls with this status (ok, empty, error, timeout, rate_limited, invalid_action).")] = "",
    run: Annotated[str, typer.Option("--run", help="Only this run id.")] = "",
    limit: Annotated[int, typer.Option("--limit", min=1, help="Rows shown.")] = 50,
    config: ConfigOpt = None,
    sets: SetOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """List tool calls from the call log (every tool call of every stored trajectory, written by the
    rollout beside the trajectories): name, arguments, status, latency, exit code and output (clipped
    to data.max_tool_output_bytes; `output_bytes` is the whole output's size). Options combine with and.

    Examples:

    * `agentrl data calls --task count_lines-0003`

    * `agentrl data calls --run 20261129-101500-ab12cd --status error --json`

    * `agentrl data calls --trajectory 20261129-101500-ab12cd-train-g0-0 --tool run_shell`
    """
    from agentrl_cli.runtime.data.calls import calls_filter, read_calls
    from agentrl_cli.core.episode import OBSERVATION_STATUSES

    if status and status not in OBSERVATION_STATUSES:
        raise UsageError(f"--status {status!r} is not a call status",
                         f"use one of {', '.join(OBSERVATION_STATUSES)} (a command that exited non-zero is `error`)")
    loaded = load(config, sets)
    table = read_calls(_store(loaded.config), calls_filter(run=run, trajectory=trajectory, task=task, tool=tool,
                                                           status=status))
    shown = table.slice(0, limit).to_pylist()
    if json_out:
        for row in shown:
            row["started_at"] = row["started_at"].isoformat() if row.get("started_at") else None
        print_json({"matched": table.num_rows, "shown": len(shown), "rows": shown})
        return
    t = Table()
    for c in CALL_COLUMNS:
        t.add_column(c, overflow="fold")
    for r in shown:
        cells = {**r, "output": (r.get("output") or "")[:80].replace("\n", " "), "arguments": (r.get("arguments") or "")[:80]}
        t.add_row(*(_fmt(cells.get(c)) for c in CALL_COLUMNS))
    out().print(t)
    typer.echo(f"{table.num_rows} matched, {len(shown)} shown", err=True)


@app.command("metrics")
def metrics(
    run: Annotated[str, typer.Argument(help="Run id (default: every run in the store).")] = "",
    by: Annotated[str, typer.Option("--by", help="Group keys, comma-separated: harness, task_type, phase.")] = "harness,task_type,phase",
    config: ConfigOpt = None,
    sets: SetOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Evaluation metrics from trajectories: success and partial completion, turns and
    tool calls, tool failure / timeout / abnormal termination rates, invalid and repeated actions.

    Examples:

    * `agentrl data metrics 20261129-101500-ab12cd`

    * `agentrl data metrics --by harness --json`
    """
    from agentrl_cli.runtime.data.metrics import METRICS, compute_metrics
    from agentrl_cli.runtime.data.query import filter_table

    loaded = load(config, sets)
    table = _store(loaded.config).read_table()
    if run:
        table = filter_table(table, f"run_id == {run!r}")
        if table.num_rows == 0:
            raise UsageError(f"no trajectories of run {run!r} in the store ({loaded.config.data.store})",
                             "list what is there with `agentrl data query --json`")
    keys = tuple(k.strip() for k in by.split(",") if k.strip())
    rows = compute_metrics(table, group_by=keys)
    if json_out:
        print_json({"group_by": list(keys), "rows": rows})
        return
    t = Table(*keys, *(m.label for m in METRICS))
    for r in rows:
        t.add_row(*(str(r[k]) for k in keys), *(_fmt(r[m.key]) for m in METRICS))
    out().print(t)


@app.command("gc")
def gc(
    older_than: Annotated[str, typer.Option("--older-than", help="Age, e.g. 30d, 12h (default: data.retention_days).")] = "",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only list what would be deleted.")] = False,
    config: ConfigOpt = None,
    sets: SetOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Delete trajectory files in date partitions older than the retention.

    Examples:

    * `agentrl data gc --older-than 30d --dry-run`

    * `agentrl data gc`
    """
    from agentrl_cli.runtime.data.gc import collect_garbage, parse_age, remove_stale_temp_files

    loaded = load(config, sets)
    try:
        age = parse_age(older_than or f"{loaded.config.data.retention_days}d")
    except ValueError as exc:
        raise UsageError(f"bad --older-than {older_than!r}: {exc}", "use a number and a unit: 30d, 12h, 90m") from None
    store = _store(loaded.config)
    report = collect_garbage(store, age, dry_run=dry_run)
    if not dry_run:
        report["stale_temp_files"] = remove_stale_temp_files(store)
    if json_out:
        print_json(report)
        return
    verb = "would delete" if dry_run else "deleted"
    typer.echo(f"{verb} {len(report['deleted'])} files ({report['bytes']} bytes) older than {report['cutoff']}; "
               f"kept {report['kept']}; skipped {len(report['skipped'])}")


@app.command("spool")
def spool(config: ConfigOpt = None, sets: SetOpt = None, json_out: JsonOpt = False) -> None:
    """Upload trajectory files spooled locally while the object store was unreachable (S3 only).

    Examples:

    * `agentrl data spool --set data.store=s3 --set data.s3.endpoint_url=http://minio:9000`
    """
    loaded = load(config, sets)
    store = _store(loaded.config)
    if not hasattr(store, "upload_spool"):
        raise UsageError("data.store is local: nothing is ever spooled", "set data.store: s3 to use an object store")
    report = store.upload_spool()
    if json_out:
        print_json(report)
        return
    typer.echo(str(report))
