"""Reclaiming what killed processes left behind: sandboxes whose owner died without closing them.

A sandbox's id starts with the pid of the process that started it (`<pid>-<n>-<hex>`), and it owns
three things outside that process: its work directory under `sandbox.root_dir` (a run's sandboxes
sit one level down, in `run-<id>/`), the tmpfs mounted there, and its cgroups. A run killed by the
OOM killer or SIGKILL never closes them; the mounts then stay in the host's mount table, and every
later sandbox pays for them (each new mount namespace copies the whole table). `reclaim_orphans`
removes the sandboxes whose owner is no longer alive: it kills what still runs in their cgroups,
removes the cgroups, unmounts the tmpfs and deletes the directory. Sandboxes of live processes are
never touched.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from pathlib import Path

from agentrl_cli.envs.sandbox.cgroups import CgroupSet, v1_base, v2_base
from agentrl_cli.envs.sandbox.sandbox import umount_detach

SANDBOX_ID = re.compile(r"^(\d+)-\d+-[0-9a-f]{6}$")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        pass
    return True


def _owner(name: str) -> int | None:
    m = SANDBOX_ID.match(name)
    return int(m.group(1)) if m else None


def _mounts_under(root: Path) -> list[Path]:
    """Mount points at or below `root` in this process's mount namespace, deepest first."""
    prefix = str(root.resolve()).rstrip("/") + "/"
    found = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        fields = line.split()
        if len(fields) > 4:
            point = fields[4].encode().decode("unicode_escape")  # mountinfo escapes spaces as \040
            if point.startswith(prefix):
                found.append(Path(point))
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def _cgroups(name: str) -> CgroupSet | None:
    """The cgroups named `name` beside this process's own sandbox groups (v2, or the v1 controllers)."""
    v2 = v2_base()
    if v2 is not None:
        return CgroupSet({"unified": v2 / name}, 2) if (v2 / name).is_dir() else None
    dirs = {c: base / name for c in ("pids", "memory", "cpu", "cpuacct") if (base := v1_base(c)) is not None and (base / name).is_dir()}
    return CgroupSet(dirs, 1) if dirs else None


def orphaned(root: Path) -> list[Path]:
    """Sandbox directories under `root` (and `root/run-*/`) whose owner process is gone."""
    out: list[Path] = []
    if not root.is_dir():
        return out
    parents = [root] + [p for p in root.iterdir() if p.is_dir() and p.name.startswith("run-")]
    for parent in parents:
        try:
            entries = list(parent.iterdir())
        except OSError:
            continue
        for d in entries:
            pid = _owner(d.name)
            if pid is not None and d.is_dir() and pid != os.getpid() and not _alive(pid):
                out.append(d)
    return out


def reclaim_orphans(root: Path) -> dict:
    """Remove the orphaned sandboxes under `root`; returns counts of what was reclaimed."""
    counts = {"sandboxes": 0, "mounts": 0, "cgroups": 0, "processes": 0, "errors": 0}
    root = Path(root).expanduser()
    for d in orphaned(root):
        cg = _cgroups(d.name)
        if cg is not None:
            counts["processes"] += len(cg.pids())
            cg.destroy()
            counts["cgroups"] += sum(1 for g in cg.dirs.values() if not g.exists())
        for point in _mounts_under(d):
            umount_detach(point)
            counts["mounts"] += 1
        try:
            shutil.rmtree(d)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                counts["errors"] += 1
                continue
        counts["sandboxes"] += 1
        if d.parent != root and all(p.name.startswith("support-") for p in d.parent.iterdir()):
            shutil.rmtree(d.parent, ignore_errors=True)  # the dead run's own directory (one per run), once empty
    return counts
