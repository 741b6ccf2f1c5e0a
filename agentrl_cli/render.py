"""Rich views of reports for the console. Results go to stdout; the command modules call these."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from agentrl_cli.report import FAIL, INFO, PASS, SKIP, StageReport, format_measured

STYLE = {PASS: "green", FAIL: "bold red", SKIP: "yellow", INFO: "cyan"}


def status_text(status: str) -> Text:
    return Text(status.upper(), style=STYLE.get(status, ""))


def render_report(console: Console, report: StageReport, verbose: bool = False) -> None:
    table = Table(title=f"Stage {report.stage}: {report.title}", title_justify="left", expand=False)
    table.add_column("check")
    table.add_column("status")
    table.add_column("measured", overflow="fold")
    table.add_column("expected", overflow="fold")
    for ch in report.checks:
        table.add_row(ch.name, status_text(ch.status), format_measured(ch.measured), ch.expected)
    console.print(table)
    for ch in report.checks:
        if ch.status in (PASS, INFO):
            continue
        first = ch.detail.splitlines()[0] if ch.detail else ""
        console.print(Text.assemble(("  ✗ " if ch.status == FAIL else "  ○ ", STYLE[ch.status]), (ch.name, "bold"), f": {first}"))
        if ch.hint:
            console.print(Text(f"    what to do: {ch.hint}", style="dim"))
        if verbose and ch.detail.count("\n") > 1:
            console.print(Text(ch.detail, style="dim"))
    for note in report.notes:
        console.print(Text(f"  note: {note}", style="yellow"))


def render_summary(console: Console, reports: list[StageReport], run_dir: str) -> None:
    table = Table(title="Summary", title_justify="left")
    for col in ("stage", "title", "status", "pass", "fail", "skip", "info", "seconds"):
        table.add_column(col)
    for r in reports:
        c = r.counts()
        table.add_row(str(r.stage), r.title, status_text(r.status), str(c[PASS]), str(c[FAIL]), str(c[SKIP]), str(c[INFO]),
                      f"{r.duration_s:.1f}")
    console.print(table)
    failed = [r.stage for r in reports if r.status == FAIL]
    console.print(f"Reports: {run_dir}/reports/")
    if failed:
        first = failed[0]
        console.print(Text(f"Next: fix the failing checks above, starting with stage {first} "
                           f"(`agentrl stage show {first}`), then `agentrl stage run {first}` again.", style="bold"))
    else:
        console.print(Text("All stages run passed. Next: `agentrl verify`.", style="green"))
