"""Rich views of reports for the console. Results go to stdout; the command modules call these.

`print_table`: on a terminal a table fits the window; anywhere else (a pipe, a file, CI logs) it
keeps every cell whole at its natural width instead of squeezing to 80 columns (`--json` stays the
machine interface).
"""

from __future__ import annotations

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from agentrl_cli.report import FAIL, INFO, PASS, SKIP, StageReport, format_measured

STYLE = {PASS: "green", FAIL: "bold red", SKIP: "yellow", INFO: "cyan"}


def print_table(console: Console, table: Table) -> None:
    """Print `table`; when the console is not a terminal, as wide as its contents need."""
    if console.is_terminal:
        console.print(table)
        return
    natural = Measurement.get(console, console.options.update_width(100_000), table).maximum
    width = console.width
    console.width = max(width, natural)
    try:
        console.print(table)
    finally:
        console.width = width


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
    print_table(console, table)
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
    print_table(console, table)
    failed = [r.stage for r in reports if r.status == FAIL]
    console.print(f"Reports: {run_dir}/reports/", soft_wrap=True)
    if failed:
        first = failed[0]
        console.print(Text(f"Next: fix the failing checks above, starting with stage {first} "
                           f"(`agentrl stage show {first}`), then `agentrl stage run {first}` again.", style="bold"), soft_wrap=True)
    else:
        console.print(Text("All stages run passed. Next: `agentrl verify`.", style="green"))


class StageProgress:
    """The stage runner's progress on stderr: a spinner with the current stage and step on a
    terminal; elsewhere one plain line per new message, with the time since the run began."""

    def __init__(self, console: Console) -> None:
        import time

        self.console, self.clock = console, time.monotonic
        self.t0 = self.clock()
        self.stage, self.last = "", ""
        self.status = console.status("starting") if console.is_terminal else None

    def __enter__(self) -> "StageProgress":
        if self.status is not None:
            self.status.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.status is not None:
            self.status.stop()

    def start_stage(self, spec) -> None:
        self.stage = f"stage {spec.number}: {spec.title}"
        self._show(self.stage)

    def message(self, text: str) -> None:
        self._show(f"{self.stage} — {text}" if self.stage else text)

    def _show(self, text: str) -> None:
        if self.status is not None:
            self.status.update(text)
        elif text != self.last:
            self.console.print(f"[{int(self.clock() - self.t0):>4d}s] {text}", markup=False, highlight=False, soft_wrap=True)
        self.last = text

    def paused(self):
        """`with progress.paused():` — the spinner stops while a result prints, then resumes."""
        from contextlib import contextmanager

        @contextmanager
        def pause():
            if self.status is not None:
                self.status.stop()
            try:
                yield
            finally:
                if self.status is not None:
                    self.status.start()
        return pause()
