"""Which transport `training.weight_sync` names: a row here, or a `module:Class` path. A transport
class builds itself from the platform config with `from_config(cfg, client, workdir)`. The engine
(`inference.engine`) says which transports it takes and how many group ranks each server joins.

With `training.lora` set, `disk` means the adapter transport (`lora.py`: the adapter alone, a full
sync only when a server refuses it). `distributed` stays the full broadcast: the trainer's tensors
are the merged weights (base + adapter), so the servers serve the policy as their base weights and
no adapter is sent; it moves as many bytes as without LoRA."""

from __future__ import annotations

from pathlib import Path

from agentrl_cli.core import parts
from agentrl_cli.core.errors import ConfigError
from agentrl_cli.core.plugins import load_class
from agentrl_cli.engines.registry import engine_for
from agentrl_cli.weightsync.base import WeightTransport

TRANSPORTS: dict[str, str] = parts.table(parts.TRANSPORTS)  # the rows: core/parts.py
LORA_TRANSPORTS: dict[str, str] = parts.table(parts.LORA_TRANSPORTS)  # with training.lora


def ranks_per_server(cfg) -> int:
    """Weight-update group ranks each server joins, as its engine says (SGLang one per
    tensor-parallel GPU, `inference.tp_size`; the embedded server one)."""
    return engine_for(cfg).tp_size(cfg.inference)


def check_engine_takes(cfg) -> None:
    """ConfigError when the engine does not honour the configured transport (or, with training.lora,
    adapters); a `module:Class` transport is the user's to match with the engine."""
    engine, name = engine_for(cfg), cfg.training.weight_sync
    if name in TRANSPORTS and name not in engine.capabilities.transports:
        raise ConfigError(f"training.weight_sync {name!r}: the {engine.title} engine (inference.engine "
                          f"{cfg.inference.engine!r}) does not take it",
                          f"set training.weight_sync to one of {', '.join(sorted(engine.capabilities.transports))}")
    if cfg.training.lora is not None and name in LORA_TRANSPORTS and not engine.capabilities.adapters:
        raise ConfigError(f"training.lora: the {engine.title} engine (inference.engine {cfg.inference.engine!r}) "
                          "loads no LoRA adapters at run time", "unset training.lora or use an engine that takes adapters")


def make_transport(cfg, client, workdir: Path) -> WeightTransport:
    """The `training.weight_sync` transport for a run whose files live under `workdir`."""
    check_engine_takes(cfg)
    rows = TRANSPORTS if cfg.training.lora is None else {**TRANSPORTS, **LORA_TRANSPORTS}
    cls = load_class("weight-sync transport", cfg.training.weight_sync, rows, "training.weight_sync")
    client.use_adapter(None)  # a run starts on the servers' base weights, whatever an earlier run here published
    return cls.from_config(cfg, client, Path(workdir))
