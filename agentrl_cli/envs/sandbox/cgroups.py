"""Per-sandbox cgroups: a process limit, a memory limit, an optional CPU quota (cores of bandwidth per
100 ms period), an OOM-kill counter, the group's resource use (`usage`), and kill-all.

Groups are created under this process's own cgroup (so the host's accounting still covers them):
cgroup v1 `pids` and `memory` controllers (and `cpuacct` for CPU time, where it is mounted), or the
v2 unified hierarchy where its controllers are delegated. When neither is writable, `CgroupSet.create`
returns None and the sandbox falls back to rlimits; the stage-5 report says which is in force.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
PREFIX = "agentrl-sandbox"
CPU_PERIOD_US = 100_000


def _own_paths() -> dict[str, str]:
    """controller -> this process's cgroup path ('' key for v2)."""
    paths = {}
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for c in controllers.split(",") if controllers else [""]:
                paths[c] = path
    except OSError:
        pass
    return paths


def v1_base(controller: str) -> Path | None:
    own = _own_paths().get(controller)
    base = ROOT / controller
    if own is None or not (base / "cgroup.procs").exists():
        return None
    return base / own.lstrip("/") / PREFIX


def v2_base() -> Path | None:
    if not (ROOT / "cgroup.controllers").exists():
        return None
    own = _own_paths().get("", "/")
    return ROOT / own.lstrip("/") / PREFIX


class CgroupSet:
    """The cgroups of one sandbox."""

    def __init__(self, dirs: dict[str, Path], version: int) -> None:
        self.dirs = dirs  # "pids"/"memory" (v1) or "unified" (v2) -> directory
        self.version = version

    @classmethod
    def create(cls, name: str, max_processes: int, memory_bytes: int, cpu_cores: float | None = None) -> "CgroupSet | None":
        """The groups with their limits, or None when the host does not let us create them. A CPU quota
        that cannot be set (no cpu controller) is an error too: the limit was asked for."""
        dirs: dict[str, Path] = {}
        quota = None if cpu_cores is None else max(1000, int(cpu_cores * CPU_PERIOD_US))
        try:
            v2 = v2_base()
            if v2 is not None:
                d = v2 / name
                d.mkdir(parents=True, exist_ok=False)
                dirs["unified"] = d
                (d / "pids.max").write_text(str(max_processes))
                (d / "memory.max").write_text(str(memory_bytes))
                (d / "memory.swap.max").write_text("0") if (d / "memory.swap.max").exists() else None
                if quota is not None:
                    (d / "cpu.max").write_text(f"{quota} {CPU_PERIOD_US}")
                return cls(dirs, 2)
            for controller in ("pids", "memory", *(("cpu",) if quota is not None else ())):
                base = v1_base(controller)
                if base is None:
                    raise OSError(f"cgroup v1 controller {controller} not mounted")
                d = base / name
                d.mkdir(parents=True, exist_ok=False)
                dirs[controller] = d
            acct = v1_base("cpuacct")
            if acct is not None:  # the same directory as the cpu group's where the two are mounted together
                same = next((d for d in dirs.values() if d.resolve() == (acct / name).resolve()), None)
                if same is not None:
                    dirs["cpuacct"] = same
                else:
                    _optional_group(dirs, "cpuacct", acct / name)
            (dirs["pids"] / "pids.max").write_text(str(max_processes))
            (dirs["memory"] / "memory.limit_in_bytes").write_text(str(memory_bytes))
            if quota is not None:
                (dirs["cpu"] / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
                (dirs["cpu"] / "cpu.cfs_quota_us").write_text(str(quota))
            memsw = dirs["memory"] / "memory.memsw.limit_in_bytes"
            if memsw.exists():
                try:
                    memsw.write_text(str(memory_bytes))
                except OSError:
                    pass
            return cls(dirs, 1)
        except OSError:
            cls(dirs, 0).destroy()
            return None

    def join_self(self) -> None:
        """Move the calling process into every group (called in the child before exec)."""
        for d in self.dirs.values():
            with open(d / "cgroup.procs", "w") as f:
                f.write("0")

    def pids(self) -> set[int]:
        found: set[int] = set()
        for d in self.dirs.values():
            try:
                found.update(int(p) for p in (d / "cgroup.procs").read_text().split())
            except OSError:
                pass
        return found

    def usage(self) -> dict:
        """What the group used so far: `cpu_s` (CPU time of every process it ever held), `peak_memory_bytes`
        (its memory high-water mark), `processes` (peak count where the kernel keeps one, else the
        count now) and `open_files` (file descriptors its processes hold now, from /proc/<pid>/fd).
        A figure the host does not provide is None."""
        return {"cpu_s": self._cpu_s(), "peak_memory_bytes": self._peak_memory(),
                "processes": self._processes(), "open_files": open_files(self.pids())}

    def _read_int(self, controller: str, v1_file: str, v2_file: str) -> int | None:
        d = self.dirs.get("unified" if self.version == 2 else controller)
        try:
            return int((d / (v2_file if self.version == 2 else v1_file)).read_text().split()[0]) if d else None
        except (OSError, ValueError, IndexError):
            return None

    def _cpu_s(self) -> float | None:
        if self.version == 2:
            try:
                text = (self.dirs["unified"] / "cpu.stat").read_text()
            except (OSError, KeyError):
                return None
            for line in text.splitlines():
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    return int(value) / 1e6
            return None
        ns = self._read_int("cpuacct", "cpuacct.usage", "")
        return None if ns is None else ns / 1e9

    def _peak_memory(self) -> int | None:
        return self._read_int("memory", "memory.max_usage_in_bytes", "memory.peak")

    def _processes(self) -> int | None:
        peak = self._read_int("pids", "pids.peak", "pids.peak")
        return peak if peak is not None else self._read_int("pids", "pids.current", "pids.current")

    def oom_kills(self) -> int:
        try:
            if self.version == 2:
                text = (self.dirs["unified"] / "memory.events").read_text()
            else:
                text = (self.dirs["memory"] / "memory.oom_control").read_text()
        except (OSError, KeyError):
            return 0
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def kill_all(self, deadline_s: float = 5.0) -> bool:
        """SIGKILL every process in the groups until they are empty; True when empty."""
        end = time.monotonic() + deadline_s
        if self.version == 2 and (self.dirs["unified"] / "cgroup.kill").exists():
            try:
                (self.dirs["unified"] / "cgroup.kill").write_text("1")
            except OSError:
                pass
        while True:
            pids = self.pids()
            if not pids:
                return True
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if time.monotonic() > end:
                return False
            time.sleep(0.005)

    def destroy(self) -> None:
        self.kill_all()
        for d in self.dirs.values():
            for _ in range(200):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.005)  # the kernel frees a group shortly after its last process exits


def _optional_group(dirs: dict[str, Path], controller: str, d: Path) -> None:
    """Create a group of a controller the sandbox can do without (accounting only)."""
    try:
        d.mkdir(parents=True, exist_ok=False)
        dirs[controller] = d
    except OSError:
        pass


def open_files(pids) -> int | None:
    """File descriptors held by `pids` (from /proc/<pid>/fd); None when none of them could be read."""
    total, read = 0, False
    for pid in pids:
        try:
            total += len(os.listdir(f"/proc/{pid}/fd"))
            read = True
        except OSError:
            pass
    return total if read else None


def cgroup_support() -> str:
    """'v2', 'v1' or 'none: reason' for this host, by trying to create a group."""
    probe = CgroupSet.create(f"probe-{os.getpid()}-{time.monotonic_ns()}", 8, 64 * 1024 * 1024)
    if probe is None:
        return "none: cgroups not writable here (limits fall back to rlimits)"
    version = probe.version
    probe.destroy()
    return f"v{version}"
