"""The host as simulated nodes need it: whether it can make them (root, iproute2, util-linux), the
`ip` command, the named network namespaces (`/run/netns`), the processes inside one, a process's
identity (pid and start time, so a reused pid is never mistaken for ours) and killing with a deadline.

Belongs here: small facts about and actions on the host, each one system call or one command. Does not:
what a node or a network is (`nodes.py`), what a run recorded or which leftovers to remove (`leftovers.py`).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from agentrl_cli.core.errors import AgentrlError

NETNS_DIR = Path("/run/netns")  # where `ip netns add` bind-mounts each named namespace
TOOLS = {"ip": "iproute2", "unshare": "util-linux", "mount": "mount", "hostname": "hostname"}


class NodesUnavailable(AgentrlError):
    """This host cannot make simulated nodes (not root, or a tool is missing); the hint says how to fix it."""


def unavailable() -> NodesUnavailable | None:
    """Why simulated nodes cannot be made here, as an error carrying the fix; None when they can."""
    if os.geteuid() != 0:
        return NodesUnavailable("simulated nodes need root: network namespaces, veth pairs and bridges need "
                                "CAP_SYS_ADMIN and CAP_NET_ADMIN", "run the command as root (sudo -E agentrl ...)")
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        packages = " ".join(sorted({TOOLS[t] for t in missing}))
        return NodesUnavailable(f"simulated nodes need {', '.join(missing)}, not found on PATH",
                                f"install them: apt-get install -y {packages}")
    return None


def ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """Run `ip [-n NETNS] ARGS...`; a failure raises NodesUnavailable with ip's own message."""
    argv = ["ip"] + (["-n", netns] if netns else []) + list(args)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise NodesUnavailable(f"`{' '.join(argv)}` failed: {done.stderr.strip() or done.returncode}",
                               "see ip's message; `agentrl sandbox reclaim` removes what a failed rehearsal left")
    return done


def netns_names() -> list[str]:
    """The named network namespaces (`ip netns list`), without their ids."""
    try:
        return sorted(p.name for p in NETNS_DIR.iterdir())
    except OSError:
        return []


def is_mountpoint(path: Path) -> bool:
    """Whether `path` is a mount point in this process's mount namespace."""
    target = str(path)
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return False
    return any(len(f := line.split()) > 4 and f[4] == target for line in lines)


def proc_start(pid: int) -> int | None:
    """The start time of process `pid` in clock ticks since boot (stat field 22); None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()  # the command name may hold spaces and parentheses
    return int(fields[19]) if len(fields) > 19 else None


def alive(pid: int, start: int | None) -> bool:
    """Whether the process `pid` that started at `start` still runs (not a later process given the same pid)."""
    now = proc_start(pid)
    return now is not None and (start is None or now == start) and not _zombie(pid)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


def pids_in(netns: str) -> list[int]:
    """The live processes whose network namespace is the named one (what `ip netns pids` prints)."""
    try:
        ns = os.stat(NETNS_DIR / netns)
    except OSError:
        return []
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            st = os.stat(entry / "ns" / "net")
        except OSError:
            continue
        if (st.st_ino, st.st_dev) == (ns.st_ino, ns.st_dev) and not _zombie(int(entry.name)):
            found.append(int(entry.name))
    return sorted(found)


def kill_and_wait(pids: list[int], deadline_s: float = 10.0) -> int:
    """SIGKILL `pids` and wait until none runs (or the deadline passes); returns how many were killed."""
    killed = 0
    for pid in set(pids):
        try:
            os.kill(pid, signal.SIGKILL)
            killed += 1
        except ProcessLookupError:
            pass
    until = time.monotonic() + deadline_s
    while any(proc_start(p) is not None and not _zombie(p) for p in pids) and time.monotonic() < until:
        time.sleep(0.01)
    return killed
