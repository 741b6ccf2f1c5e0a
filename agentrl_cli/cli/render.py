"""Rich views of reports for the console. Results go to stdout; the command modules call these.

`render_checks` is the one console view of a list of checks (stage, verify, bench and image all
print through it); the Markdown and JSON views are `core/report.py`'s.

Tables: on a terminal a table fits the window; anywhere else (a pipe, a file, CI logs) it keeps
every cell and its title whole at their natural width, one line per row, instead of squeezing to 80
columns and cutting keys (`agentrl config show --describe | grep training.lora` finds the whole row).
Cells are data, never rich markup: a `[name]` in a value is printed, not swallowed as a style.
`ResultConsole` (the stdout console every command prints through) does this for every table it
prints; `print_table` does it on any console. `--json` stays the machine interface.
"""

from __future__ import annotations

from contextlib import contextmanager

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from agentrl_cli.core.report import Check, CheckStatus, StageReport, first_line, format_measured

STYLE = {CheckStatus.PASS: "green", CheckStatus.FAIL: "bold red", CheckStatus.SKIP: "yellow", CheckStatus.INFO: "cyan"}
MARK = {CheckStatus.FAIL: "  ✗ ", CheckStatus.SKIP: "  ○ "}


UNLIMITED = 1_000_000


@contextmanager
def natural_width(console: Console, tables: list[Table]):
    """While inside, `console` (not a terminal) is as wide as the widest of `tables` and its title needs."""
    options = console.options.update_width(UNLIMITED)
    natural = max((Measurement.get(console, options, part).maximum
                   for table in tables for part in (table, table.title) if part is not None), default=0)
    width = console.width
    console.width = max(width, natural)
    try:
        yield
    finally:
        console.width = width


class ResultConsole(Console):
    """A console whose `print` keeps every table whole when it does not write to a terminal, and
    reads table cells as data, never as markup (`[mis_low, mis_high]` stays in the row)."""

    def print(self, *objects, **kwargs) -> None:
        tables = [o for o in objects if isinstance(o, Table)]
        if not tables:
            super().print(*objects, **kwargs)
            return
        kwargs.setdefault("markup", False)
        if self.is_terminal:
            super().print(*objects, **kwargs)
            return
        with natural_width(self, tables):
            super().print(*objects, **kwargs)


def print_table(console: Console, table: Table) -> None:
    """Print `table`, its cells as data (no markup); when the console is not a terminal, as wide as
    its contents need."""
    if console.is_terminal:
        console.print(table, markup=False)
        return
    with natural_width(console, [table]):
        console.print(table, markup=False)


def status_text(status: str) -> Text:
    return Text(status.upper(), style=STYLE.get(status, ""))


def render_checks(console: Console, checks: list[Check] | dict[str, list[Check]], title: str, *,
                  verbose: bool = False, group: str = "layer") -> None:
    """The checks as a table, then each failure and skip with its first detail line and what to do
    (`verbose`: its whole detail when long). A dict of check lists adds a first column, `group`,
    naming each list (verify's layers)."""
    groups = checks if isinstance(checks, dict) else {"": checks}
    grouped = isinstance(checks, dict)
    table = Table(title=title, title_justify="left", expand=False)
    for col in ((group,) if grouped else ()) + ("check", "status", "measured", "expected"):
        table.add_column(col, overflow="fold")
    for key, members in groups.items():
        for ch in members:
            table.add_row(*((key,) if grouped else ()), ch.name, status_text(ch.status), format_measured(ch.measured), ch.expected)
    print_table(console, table)
    for ch in (c for members in groups.values() for c in members):
        if ch.status not in MARK:
            continue
        first = first_line(ch.detail)
        console.print(Text.assemble((MARK[ch.status], STYLE[ch.status]), (ch.name, "bold"), f": {first}"))
        if ch.hint and ch.hint != first:
            console.print(Text(f"    what to do: {ch.hint}", style="dim"))
        if verbose and ch.detail.count("\n") > 1:
            console.print(Text(ch.detail, style="dim"))


def render_report(console: Console, report: StageReport, verbose: bool = False) -> None:
    render_checks(console, report.checks, f"Stage {report.stage}: {report.title}", verbose=verbose)
    for note in report.notes:
        console.print(Text(f"  note: {note}", style="yellow"))


def render_summary(console: Console, reports: list[StageReport], run_dir: str) -> None:
    table = Table(title="Summary", title_justify="left")
    for col in ("stage", "title", "status", *(s.value for s in CheckStatus), "seconds"):
        table.add_column(col)
    for r in reports:
        table.add_row(str(r.stage), r.title, status_text(r.status), *map(str, r.counts().values()), f"{r.duration_s:.1f}")
    print_table(console, table)
    failed = [r.stage for r in reports if r.status == CheckStatus.FAIL]
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
