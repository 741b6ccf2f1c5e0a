"""Which transport `training.weight_sync` names: a row here, or a `module:Class` path. A transport
class builds itself from the platform config with `from_config(cfg, client, workdir)`."""

from __future__ import annotations

from pathlib import Path

from agentrl_cli.plugins import load_class
from agentrl_cli.weightsync.base import WeightTransport

TRANSPORTS: dict[str, str] = {
    "disk": "agentrl_cli.weightsync.disk:DiskTransport",
    "distributed": "agentrl_cli.weightsync.distributed:DistributedTransport",
}


def ranks_per_server(cfg) -> int:
    """Weight-update group ranks each server joins: SGLang one per tensor-parallel GPU
    (`inference.tp_size`); the embedded server one."""
    return cfg.inference.tp_size if cfg.inference.engine == "sglang" else 1


def make_transport(cfg, client, workdir: Path) -> WeightTransport:
    """The `training.weight_sync` transport for a run whose files live under `workdir`."""
    cls = load_class("weight-sync transport", cfg.training.weight_sync, TRANSPORTS, "training.weight_sync")
    return cls.from_config(cfg, client, Path(workdir))
