"""Processes started during a window of this process's work that outlived it: while the window is
open, this process's environment carries a marker (`MARK`, a fresh token), which every process
started meanwhile inherits, directly or through its parents (a detached one too: `setsid`, a double
fork, a new session); after the window, a process whose environment still holds the token is a
leftover. A process started with an environment of its own (a sandbox's command) does not carry it:
the sandbox pool counts what outlives a sandbox (`pool.SandboxPool`'s `leaked_processes`).

Belongs here: marking, finding and ending leftovers. Not here: what is judged a leak (the caller).
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

MARK = "AGENTRL_LEFTOVER_MARK"


@contextmanager
def marked():
    """Open a window: yields its token; processes started until it closes carry it. Open it before
    the threads that start processes, close it after they ended (the environment is the process's own)."""
    token = uuid.uuid4().hex
    before = os.environ.get(MARK)
    os.environ[MARK] = token
    try:
        yield token
    finally:
        if before is None:
            os.environ.pop(MARK, None)
        else:
            os.environ[MARK] = before


def carrying(token: str) -> dict[int, str]:
    """pid -> command line of the live processes (zombies left out) whose environment holds `token`."""
    needle = f"{MARK}={token}".encode()
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace").strip()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        found[int(entry.name)] = cmdline
    return found


def leftovers(token: str, settle_s: float = 1.0) -> dict[int, str]:
    """The processes still carrying `token` once those already ending have had `settle_s` to go."""
    end = time.monotonic() + settle_s
    while True:
        found = carrying(token)
        if not found or time.monotonic() >= end:
            return found
        time.sleep(0.05)


def end(pids, deadline_s: float = 10.0) -> None:
    """SIGKILL each of `pids` (already gone: nothing to do), then wait up to `deadline_s` until each is
    dead (gone, or a zombie its parent has yet to reap): a kill is delivered asynchronously, and a
    caller that looks right after must not find them still running."""
    pids = list(pids)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    end_at = time.monotonic() + deadline_s
    while any(_running(pid) for pid in pids) and time.monotonic() < end_at:
        time.sleep(0.01)


def _running(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie (its state, the field after the command name in
    /proc/PID/stat, is not Z or X)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:][:1] not in ("Z", "X")
