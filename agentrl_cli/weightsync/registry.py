"""Which transport `training.weight_sync` names: a row here, or a `module:Class` path. A transport
class builds itself from the platform config with `from_config(cfg, client, workdir)`.

With `training.lora` set, `disk` means the adapter transport (`lora.py`: the adapter alone, a full
sync only when a server refuses it). `distributed` stays the full broadcast: the trainer's tensors
are the merged weights (base + adapter), so the servers serve the policy as their base weights and
no adapter is sent; it moves as many bytes as without LoRA."""

from __future__ import annotations

from pathlib import Path

from agentrl_cli.core import parts
from agentrl_cli.core.plugins import load_class
from agentrl_cli.weightsync.base import WeightTransport

TRANSPORTS: dict[str, str] = parts.table(parts.TRANSPORTS)  # the rows: core/parts.py
LORA_TRANSPORTS: dict[str, str] = parts.table(parts.LORA_TRANSPORTS)  # with training.lora


def ranks_per_server(cfg) -> int:
    """Weight-update group ranks each server joins: SGLang one per tensor-parallel GPU
    (`inference.tp_size`); the embedded server one."""
    return cfg.inference.tp_size if cfg.inference.engine == "sglang" else 1


def make_transport(cfg, client, workdir: Path) -> WeightTransport:
    """The `training.weight_sync` transport for a run whose files live under `workdir`."""
    rows = TRANSPORTS if cfg.training.lora is None else {**TRANSPORTS, **LORA_TRANSPORTS}
    cls = load_class("weight-sync transport", cfg.training.weight_sync, rows, "training.weight_sync")
    client.use_adapter(None)  # a run starts on the servers' base weights, whatever an earlier run here published
    return cls.from_config(cfg, client, Path(workdir))
