"""Progress of long work: building the built-in model with a fake slow builder shows its first line
at once and a line at least every interval (5 s by default, 1 s here) even while the work reports
nothing, with phase, counts and ETA; not on a terminal, plain lines on stderr."""

from __future__ import annotations

import subprocess
import sys
import time

from agentrl_cli.core.progress import WorkProgress

# A builder whose demonstrations report as they go, then a silent stretch (initialising the model)
# longer than two progress intervals, then warm-start steps.
# The interval is 1 s here (5 s by default), so the test takes seconds, not half a minute.
SCRIPT = """
import sys, time
from pathlib import Path
from agentrl_cli.core.progress import WorkProgress
from agentrl_cli.model.resolve import resolve_model_path

WorkProgress.__init__.__kwdefaults__["interval_s"] = %(interval)s

def slow_builder(dest, progress):
    for i in range(1, 4):
        time.sleep(0.1); progress("demonstrations", i, 3)
    time.sleep(2.6)  # silent: no callback at all
    for s in range(1, 5):
        time.sleep(0.2); progress("warm start", s, 4)
    return dest

print("HEADER", flush=True, file=sys.stderr)
resolve_model_path("builtin:tiny-agent", sys.argv[1], builder=slow_builder)
"""
INTERVAL = 1.0


def test_a_slow_build_shows_progress_at_least_every_interval(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT % {"interval": INTERVAL}, str(tmp_path)], stderr=subprocess.PIPE, text=True)
    lines = []
    for line in proc.stderr:
        lines.append((time.monotonic(), line.rstrip()))
    assert proc.wait(timeout=120) == 0, lines
    header = next(t for t, text in lines if text == "HEADER")
    shown = [(t, text) for t, text in lines if text.startswith("model builtin:tiny-agent")]
    assert shown and shown[0][0] - header < 2.0, lines  # the first line comes at once, before the model libraries load
    gaps = [b[0] - a[0] for a, b in zip(shown, shown[1:])]
    assert max(gaps) <= 2 * INTERVAL, (gaps, lines)  # never silent for long, even while the builder is
    texts = [text for _, text in shown]
    assert any("demonstrations, 3/3 (100%)" in t for t in texts), texts
    assert any("warm start" in t and "ETA" in t for t in texts), texts
    assert sum("demonstrations, 3/3" in t for t in texts) >= 2, texts  # the silent stretch still ticks
    assert "built at" in texts[-1]


class _Stream:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def write(self, text: str) -> None:
        self.lines += [ln for ln in text.splitlines() if ln]

    def flush(self) -> None:
        pass


def test_status_names_phase_counts_elapsed_and_eta():
    now = [100.0]
    stream = _Stream()
    progress = WorkProgress("building", stream=stream, terminal=False, clock=lambda: now[0], interval_s=3600)
    progress.start()
    progress.update("warm start", 0, 100)
    now[0] += 30
    progress.update("warm start", 25, 100)
    assert progress.status() == "building: warm start, 25/100 (25%), 30s elapsed, ETA warm start 1m30s"
    progress.finish()
    assert stream.lines[0] == "building: started, 0s elapsed" and stream.lines[-1] == "building: done (30s)"
