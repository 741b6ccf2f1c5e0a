"""Progress of long work (building the built-in model, downloads, long benchmarks) on stderr: a rich
progress bar on a terminal, plain periodic lines anywhere else (a pipe, a file, CI logs).

`WorkProgress(what)` is a context manager with `update(phase, done, total)`. Plain mode prints a line
at once when the work starts and when a phase begins, then one every `interval_s` seconds from a
ticker thread even when the work reports nothing (a long step still shows it is alive), each with
the phase's rate and ETA. On a terminal where another live display is already running on the shared
stderr console (the stage runner's spinner), the lines print above it instead of a second bar.
Belongs here: showing progress; the work reports it through the callback.
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from typing import Callable, TextIO

INTERVAL_S = 5.0


@functools.lru_cache(maxsize=1)
def stderr_console():
    """The one rich console on stderr that progress displays share (one live display at a time)."""
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class WorkProgress:
    def __init__(self, what: str, *, phase: str = "started", stream: TextIO | None = None, interval_s: float = INTERVAL_S,
                 terminal: bool | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.what, self.interval_s, self.clock = what, interval_s, clock
        self.outcome = "done"  # the last line says how the work ended; the work may set it (e.g. "found in the cache")
        self.stream = stream
        self.terminal = (stream or sys.stderr).isatty() if terminal is None else terminal
        self.phase, self.done, self.total = phase, 0, 0
        self.t0 = self.phase_t0 = self.last_line = clock()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bar = None
        self._tasks: dict[str, int] = {}

    # ---- lifecycle ---------------------------------------------------------------------------------

    def __enter__(self) -> "WorkProgress":
        return self.start()

    def __exit__(self, kind, exc, tb) -> None:
        self.finish("failed" if kind else self.outcome)

    def start(self) -> "WorkProgress":
        if self.terminal and self.stream is None:
            self._start_bar()
        self._line(self.status())
        self._thread = threading.Thread(target=self._tick, name="progress", daemon=True)
        self._thread.start()
        return self

    def finish(self, outcome: str = "done") -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        self._line(f"{self.what}: {outcome} ({duration(self.clock() - self.t0)})")

    # ---- reports from the work ---------------------------------------------------------------------

    def update(self, phase: str, done: int, total: int) -> None:
        with self._lock:
            new_phase = phase != self.phase
            if new_phase:
                self.phase, self.phase_t0 = phase, self.clock()
            self.done, self.total = done, total
        if self._bar is not None:
            if phase not in self._tasks:
                self._tasks[phase] = self._bar.add_task(phase, total=total)
            self._bar.update(self._tasks[phase], completed=done, total=total)
        elif new_phase:
            self._line(self.status())

    def status(self) -> str:
        with self._lock:
            phase, done, total, t_phase = self.phase, self.done, self.total, self.phase_t0
        now = self.clock()
        parts = [f"{self.what}: {phase}"]
        if total:
            parts.append(f"{done}/{total} ({100 * done / total:.0f}%)")
        parts.append(f"{duration(now - self.t0)} elapsed")
        if total and done:
            rate = (now - t_phase) / done
            parts.append(f"ETA {phase} {duration(rate * (total - done))}")
        return ", ".join(parts)

    # ---- output ------------------------------------------------------------------------------------

    def _start_bar(self) -> None:
        console = stderr_console()
        if getattr(console, "_live_stack", None) or getattr(console, "_live", None):
            return  # another live display owns the console: print lines above it instead
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self._bar = Progress(TextColumn(f"{self.what}: " + "{task.description}"), BarColumn(),
                             TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(), TextColumn("ETA"),
                             TimeRemainingColumn(), console=console)
        self._bar.start()

    def _line(self, text: str) -> None:
        self.last_line = self.clock()
        if self.stream is not None:
            self.stream.write(text + "\n")
            self.stream.flush()
        elif self._bar is not None:
            self._bar.console.print(text)
        elif self.terminal:
            stderr_console().print(text)
        else:
            sys.stderr.write(text + "\n")
            sys.stderr.flush()

    def _tick(self) -> None:
        while not self._stop.wait(min(1.0, self.interval_s)):
            if self._bar is None and self.clock() - self.last_line >= self.interval_s:
                self._line(self.status())
