"""`controlplane`: the job control plane - state store, executors, pools, priorities. One module per section; `agentrl_cli/config/models.py` joins them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, field_validator

from agentrl_cli.config.sections.base import (Section)


POOL_NAME = r"^[a-z]([a-z0-9-]{0,30}[a-z0-9])?$"


class PoolConfig(Section):
    """A resource pool: a Slurm partition, a Kueue ResourceFlavor with its ClusterQueue, or a slot count on this box."""

    name: str = Field(..., pattern=POOL_NAME, description="Pool name (lower case, digits, '-'): the Slurm partition, and part of the Kueue object names")
    capacity: int = Field(1, ge=1, description="CPUs the pool offers jobs at once (local: slots; Slurm: the partition's MaxCPUsPerNode; Kueue: cpu nominalQuota)")
    quota: int = Field(2, ge=1, description="Jobs of this pool that may run at once; more wait with a reason (local: Quota; Slurm: the <pool>_jobs license; Kueue: pods nominalQuota)")
    priority: int = Field(1, ge=0, le=65533, description="Pool priority tier: a higher tier goes first and requeues jobs of preemptible lower tiers (Slurm PriorityTier; local: dispatch order)")
    preemptible: bool = Field(False, description="Jobs here may be requeued for a higher tier's job (Slurm PreemptMode=REQUEUE; Kueue ClusterQueue preemption of lower priorities)")
    node_labels: dict[str, str] = Field(default_factory=dict, description="Kubernetes node labels of this pool's nodes (the Job's nodeSelector and the ResourceFlavor's nodeLabels)")
    accelerators: int = Field(0, ge=0, description="Accelerators each job of this pool asks for (Kubernetes resource cluster.accelerator_resource, with node affinity on cluster.accelerator_product)")


class PriorityConfig(Section):
    name: str = Field(..., pattern=POOL_NAME, description="Priority class name, as `agentrl job submit --priority NAME` takes it")
    value: int = Field(..., ge=0, le=1_000_000, description="Higher runs first (local queue order; Slurm job priority; Kueue WorkloadPriorityClass value)")


class ControlPlaneConfig(Section):
    state_store: str = Field("sqlite:///runs/state.db", description="sqlite:///PATH or postgresql://USER@HOST:PORT/DB state store URL (a password comes from PGPASSWORD, the file AGENTRL_PGPASSWORD_FILE names, or ~/.pgpass, never this file)")
    executor: Literal["local", "slurm", "kubernetes"] = Field("local", description="Where jobs run: local subprocesses, Slurm (sbatch), or Kubernetes Jobs queued by Kueue")
    lease_seconds: float = Field(5.0, gt=0, le=3600, description="Leader lease: a leader that has not renewed for this long is replaced by a follower")
    host: str = Field("127.0.0.1", description="Address the health endpoint of `agentrl controlplane serve` binds (loopback by default; the rendered pods pass 0.0.0.0)")
    port: int = Field(0, ge=0, le=65535, description="Port of the health endpoint of `agentrl controlplane serve` (GET /health: 200 while the instance's lease loop runs; 0 = none, as when several instances share one host); the rendered Deployment serves it on 8740")
    api_key: SecretStr | None = Field(None, description="Bearer key(s) the control plane's HTTP API requires for everything but /health (job submission, cancellation, reads), one per line: the first is current, every one is accepted (rotation: `agentrl secrets rotate`); give it by AGENTRL_CONTROLPLANE__API_KEY_FILE, never argv")
    jobs_dir: str = Field("runs/jobs", description="Job logs and the local executor's spool (on Slurm, a directory the compute nodes share)")
    pools: list[PoolConfig] = Field(
        default_factory=lambda: [PoolConfig(name="rollout", capacity=2, quota=2, priority=1, preemptible=True),
                                 PoolConfig(name="train", capacity=2, quota=1, priority=10)],
        description="Resource pools jobs are queued into")
    priorities: list[PriorityConfig] = Field(
        default_factory=lambda: [PriorityConfig(name="low", value=100), PriorityConfig(name="high", value=1000)],
        description="Job priority classes; a job without --priority gets the lowest")

    @field_validator("pools", "priorities")
    @classmethod
    def _names_unique(cls, items: list) -> list:
        names = [i.name for i in items]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"names must be unique; repeated: {', '.join(dupes)}")
        if not items:
            raise ValueError("at least one is needed")
        return items
