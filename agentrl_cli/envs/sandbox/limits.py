"""Resource limits of one sandbox and how they are applied from outside bubblewrap.

bubblewrap sets no limits itself. Per-sandbox limits (processes, memory, CPU bandwidth) go to
cgroups when the host allows it (see `cgroups.py`), else to rlimits; per-command limits (CPU time, wall clock,
output) are applied by the supervisor to each command; file size, open files and core dumps are
rlimits on the whole sandbox.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass, replace

MB = 1024 * 1024


@dataclass(frozen=True)
class Limits:
    wall_timeout_s: float = 30.0
    cpu_time_s: int = 10
    memory_mb: int = 512
    max_processes: int = 64
    max_file_size_mb: int = 64
    max_open_files: int = 256
    tmpfs_size_mb: int = 64
    output_limit_bytes: int = MB
    cpu_cores: float | None = None  # CPU bandwidth of the whole sandbox (cgroup cpu quota); None = unlimited

    @classmethod
    def from_config(cls, sandbox_config) -> "Limits":
        c = sandbox_config
        return cls(wall_timeout_s=c.wall_timeout_s, cpu_time_s=c.cpu_time_s, memory_mb=c.memory_mb,
                   max_processes=c.max_processes, max_file_size_mb=c.max_file_size_mb,
                   max_open_files=c.max_open_files, tmpfs_size_mb=c.tmpfs_size_mb,
                   output_limit_bytes=c.output_limit_bytes)

    def with_(self, **changes) -> "Limits":
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    def sandbox_rlimits(self, cgroup_pids: bool) -> dict[int, tuple[int, int]]:
        """rlimits set on the sandbox's first process and inherited by everything in it."""
        limits = {
            resource.RLIMIT_FSIZE: (self.max_file_size_mb * MB,) * 2,
            resource.RLIMIT_NOFILE: (self.max_open_files,) * 2,
            resource.RLIMIT_CORE: (0, 0),
        }
        if not cgroup_pids:
            # Fallback only: RLIMIT_NPROC counts every process of the sandbox user on the host.
            limits[resource.RLIMIT_NPROC] = (self.max_processes,) * 2
        return limits


PRLIMIT_OPTIONS = {resource.RLIMIT_FSIZE: "--fsize", resource.RLIMIT_NOFILE: "--nofile", resource.RLIMIT_CORE: "--core",
                   resource.RLIMIT_NPROC: "--nproc"}


def prlimit_args(limits: dict[int, tuple[int, int]]) -> list[str]:
    """The same rlimits as util-linux `prlimit` options (`--fsize=SOFT:HARD` ...)."""
    return [f"{PRLIMIT_OPTIONS[which]}={soft}:{hard}" for which, (soft, hard) in limits.items()]


def apply_rlimits(limits: dict[int, tuple[int, int]]) -> None:
    for which, (soft, hard) in limits.items():
        resource.setrlimit(which, (soft, hard))
