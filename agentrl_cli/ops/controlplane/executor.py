"""The executor interface: how the control plane hands a job to a scheduler and reads its state back.

One small Protocol, one module per implementation: `local` (subprocesses on this box), `slurm`
(sbatch/squeue/scancel), `kubernetes` (Jobs queued by Kueue); `executors.py` picks one from the config. Queues, quotas, priorities and
preemption belong to the scheduler; an executor only translates. Job states are the few below,
and a waiting job always carries the scheduler's reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from agentrl_cli.config.models import ControlPlaneConfig, PoolConfig
from agentrl_cli.core.errors import AgentrlError, NotFoundError

QUEUED, PENDING, RUNNING, SUCCEEDED, FAILED, CANCELLED = "queued", "pending", "running", "succeeded", "failed", "cancelled"
ACTIVE = (QUEUED, PENDING, RUNNING)
FINISHED = (SUCCEEDED, FAILED, CANCELLED)


class ExecutorUnavailable(AgentrlError):
    """The configured executor cannot be used here (scheduler not installed or not reachable)."""


@dataclass(frozen=True)
class JobSpec:
    job_id: str
    pool: str
    priority: str
    priority_value: int
    command: list[str]
    cpus: int = 1
    log_path: str = ""
    nodes: int = 1  # nodes the job spans: the training job spans cluster.nodes (Slurm: sbatch --nodes)
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class JobStatus:
    state: str               # pending | running | succeeded | failed | cancelled
    reason: str = ""         # why it waits or ended (the scheduler's words)
    pool: str = ""           # where the scheduler placed it
    exit_code: int | None = None
    restarts: int = 0        # times it was preempted and requeued
    started_at: float | None = None  # when it (last) started, where the scheduler says


class Executor(Protocol):
    name: str

    def check(self) -> None:
        """Raise ExecutorUnavailable (with the fix) when the scheduler cannot be used from here."""

    def preemption(self) -> str:
        """'' when this executor preempts; otherwise the reason it does not."""

    def submit(self, spec: JobSpec) -> str:
        """Hand the job to the scheduler; return its id there."""

    def poll(self, external_ids: list[str]) -> dict[str, JobStatus]:
        """The current state of each job (ids the scheduler no longer knows are left out)."""

    def cancel(self, external_id: str) -> None: ...

    def logs(self, external_id: str, spec: JobSpec) -> str: ...


def pool_named(cp: ControlPlaneConfig, name: str) -> PoolConfig:
    for pool in cp.pools:
        if pool.name == name:
            return pool
    raise NotFoundError(f"pool {name!r} does not exist",
                        f"use one of: {', '.join(p.name for p in cp.pools)} (controlplane.pools in the config)")


def priority_value(cp: ControlPlaneConfig, name: str | None) -> tuple[str, int]:
    """(name, value) of a priority class; None means the lowest."""
    if name is None:
        lowest = min(cp.priorities, key=lambda p: p.value)
        return lowest.name, lowest.value
    for p in cp.priorities:
        if p.name == name:
            return p.name, p.value
    raise NotFoundError(f"priority {name!r} does not exist",
                        f"use one of: {', '.join(p.name for p in cp.priorities)} (controlplane.priorities in the config)")
