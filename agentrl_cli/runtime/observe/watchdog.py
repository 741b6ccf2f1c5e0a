"""A watchdog for a run's components (docs/security.md row 22): each reports progress, and a background
thread flags any component that has work and made no progress for longer than its deadline — an
ERROR log line naming it and how long it has been stuck, and one count `watchdog/stuck{NAME}` per
time it got stuck (the run writes these into metrics.jsonl). It only observes: recovery (retries,
resume, infra_error) is the components' own business, and nothing is killed here.

Two kinds of component:
- heartbeat: `beat(name)` alone. Watched from its first beat; stuck when the last beat is older than
  the deadline.
- on-demand (an inference server, a harness, the reward client, a train step): `begin(name)` /
  `end(name, ok)` around each piece of work, or `with watchdog.busy(name):`. Watched only while work
  is outstanding or the last attempt failed; a success (or `beat`) is progress. So an idle server is
  never stuck, a hung one is stuck from the moment its oldest unanswered request started, and one
  that keeps failing stays stuck until something succeeds on it.

Not here: deciding what to do about a stuck component.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

log = logging.getLogger(__name__)


@dataclass
class _Component:
    heartbeat: bool
    deadline_s: float
    since: float  # last progress, or when work began after a healthy idle spell
    busy: int = 0
    failing: bool = False
    flagged: bool = False  # reported as stuck and not recovered since

    def active(self) -> bool:
        return self.heartbeat or self.busy > 0 or self.failing


class Watchdog:
    def __init__(self, deadline_s: float = 300.0, *, deadlines: dict[str, float] | None = None,
                 clock: Callable[[], float] = time.monotonic, interval_s: float | None = None) -> None:
        if deadline_s <= 0:
            raise ValueError(f"watchdog deadline must be positive, got {deadline_s}")
        self.deadline_s, self.deadlines, self.clock = deadline_s, dict(deadlines or {}), clock
        self.interval_s = interval_s if interval_s is not None else min(1.0, deadline_s / 4)
        self.counts: Counter = Counter()
        self._components: dict[str, _Component] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _get(self, name: str, heartbeat: bool) -> _Component:
        c = self._components.get(name)
        if c is None:
            c = self._components[name] = _Component(heartbeat, self.deadlines.get(name, self.deadline_s), self.clock())
        return c

    def _progress(self, name: str, c: _Component, now: float) -> None:
        if c.flagged:
            log.warning("watchdog: %s made progress again", name)
        c.since, c.failing, c.flagged = now, False, False

    # ---- reports from the components -------------------------------------------------------------

    def beat(self, name: str) -> None:
        """Progress on `name` (registers a heartbeat component on first use)."""
        with self._lock:
            self._progress(name, self._get(name, heartbeat=True), self.clock())

    def begin(self, name: str) -> None:
        with self._lock:
            c = self._get(name, heartbeat=False)
            if not c.active():
                c.since = self.clock()  # the clock starts with the work, not with the idle spell before it
            c.busy += 1

    def end(self, name: str, ok: bool = True) -> None:
        with self._lock:
            c = self._get(name, heartbeat=False)
            c.busy = max(0, c.busy - 1)
            if ok:
                self._progress(name, c, self.clock())
            else:
                c.failing = True

    @contextmanager
    def busy(self, name: str):
        """`with watchdog.busy(name): ...` — begin, then end(ok) unless the block raised."""
        self.begin(name)
        ok = False
        try:
            yield
            ok = True
        finally:
            self.end(name, ok)

    # ---- checking ---------------------------------------------------------------------------------

    def stuck(self, now: float | None = None) -> dict[str, float]:
        """Components stuck now: name -> seconds since their last progress."""
        now = self.clock() if now is None else now
        with self._lock:
            return {name: round(now - c.since, 3) for name, c in self._components.items()
                    if c.active() and now - c.since > c.deadline_s}

    def check(self, now: float | None = None) -> list[str]:
        """Flag the components that became stuck since the last check (log + count); returns them."""
        stuck = self.stuck(now)
        newly = []
        with self._lock:
            for name, seconds in stuck.items():
                c = self._components[name]
                if not c.flagged:
                    c.flagged = True
                    newly.append(name)
                    self.counts[f"watchdog/stuck{{{name}}}"] += 1
                    log.error("watchdog: %s made no progress for %.1f s (deadline %.0f s)", name, seconds, c.deadline_s)
        return newly

    def report(self) -> dict[str, int]:
        """The stuck counts so far (`watchdog/stuck{NAME}` -> times), safe to read from any thread."""
        with self._lock:
            return dict(self.counts)

    def start(self) -> "Watchdog":
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="watchdog", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.check()
            except Exception:  # noqa: BLE001 - the watchdog must outlive its own bugs
                log.exception("watchdog check failed")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
