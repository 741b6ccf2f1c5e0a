"""Picks the executor `controlplane.executor` names (the implementations import the interface, not this)."""

from __future__ import annotations

from agentrl_cli.config.models import PlatformConfig
from agentrl_cli.ops.controlplane.executor import Executor
from agentrl_cli.core.errors import NotFoundError


def executor_from_config(cfg: PlatformConfig, kind: str | None = None) -> Executor:
    """The executor `controlplane.executor` names (or `kind`)."""
    kind = kind or cfg.controlplane.executor
    if kind == "local":
        from agentrl_cli.ops.controlplane.local import LocalExecutor
        return LocalExecutor(cfg.controlplane)
    if kind == "slurm":
        from agentrl_cli.ops.controlplane.slurm import SlurmExecutor
        return SlurmExecutor(cfg.controlplane)
    if kind == "kubernetes":
        from agentrl_cli.ops.controlplane.kubernetes import KubernetesExecutor
        return KubernetesExecutor(cfg)
    raise NotFoundError(f"executor {kind!r} does not exist", "use local, slurm or kubernetes (controlplane.executor)")
