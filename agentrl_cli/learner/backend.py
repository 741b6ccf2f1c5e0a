"""The trainer backend seam: what the training loop, the checkpoint manager and weight sync ask of
whatever runs the optimizer. One implementation per module (`deepspeed_backend.py` today), built as
`Class(model_path: str, training_config: TrainingConfig)` and chosen by `training.backend`: a row
of `BACKENDS`, or a `module:Class` path (`backend_class`).

What belongs here: the Protocol and its documented contract. What does not: maths (`grpo.py`),
process-group setup, file layouts of checkpoints.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

from agentrl_cli.core import parts
from agentrl_cli.core.errors import ConfigError
from agentrl_cli.core.plugins import load_class
from agentrl_cli.learner.grpo import Sample

BACKENDS: dict[str, str] = parts.table(parts.BACKENDS)  # training.backend names (the rows: core/parts.py)

STEP_METRICS = ("loss", "grad_norm", "clip_fraction", "approx_kl", "entropy", "mismatch_kl", "lr", "tokens", "samples")


@runtime_checkable
class TrainingBackend(Protocol):
    """A policy being trained on this rank. Every method that moves data between ranks (all but
    `step`, `rank`, `world_size`) must be called by all ranks together, in the same order.

    Two optional members, for LoRA (`training.lora`); agentrl reads them with `getattr`, so a backend
    without them keeps working as a full fine-tuning one (`backend_lora`):
    - `lora`: the LoraConfig the backend trains an adapter with, or None (full fine-tuning).
    - `export_adapter(dir: Path) -> Path`: write peft's adapter directory (adapter_config.json and
      adapter_model.safetensors, as `PeftModel.save_pretrained` lays them out) on rank 0 and return
      `dir`; every rank calls it. The adapter weight sync and `agentrl model export` use it."""

    step: int        # optimizer steps done (restored by load_checkpoint)
    rank: int        # this process's global rank
    world_size: int  # data-parallel ranks

    def train_step(self, samples: list[Sample]) -> dict:
        """One optimizer step on this rank's samples (gradients are averaged over ranks; each rank's
        loss is normalised by the token count over all ranks, so the mean over ranks is the step's
        loss, as one rank on the whole batch). Returns the metrics named in STEP_METRICS for this rank: loss, grad_norm (before clipping),
        clip_fraction, approx_kl, entropy, mismatch_kl (trainer vs inference log-probs before the
        update), lr, tokens (masked tokens), samples. The DeepSpeed backend adds the importance-weight
        diagnostics of `training.correction` (other than none) and `policy_lag` (corrections.py).
        Each sample's `advantage` is a float, or with `training.advantage: turn` a per-token array as
        long as its token_ids (`grpo.Sample`; `grpo.collate` makes `TrainBatch.advantages` [B, T])."""
        ...

    def save_checkpoint(self, dir: Path, client_state: dict) -> None:
        """Write model, optimizer and `client_state` (the caller's own resume data) under `dir`. With
        LoRA the model part may be the adapter alone (the base weights are the model directory's)."""
        ...

    def load_checkpoint(self, dir: Path) -> dict:
        """Restore what save_checkpoint wrote under `dir`; returns its client_state."""
        ...

    def export_weights(self, dir: Path) -> Path:
        """Write an ordinary Hugging Face model directory (config, safetensors, tokenizer files) that
        AutoModelForCausalLM.from_pretrained loads; returns its path. With LoRA the adapter is merged
        into the written weights (no adapter keys); the training model keeps its adapter."""
        ...

    def parameter_names(self) -> list[tuple[str, tuple[int, ...]]]:
        """(name, full shape) of every parameter, tied parameters under each of their names. With
        LoRA: the names of the model without adapters (`model.layers.0.self_attn.q_proj.weight`), and
        the two methods below give their merged values (so a full weight sync and its read-back
        verification work unchanged)."""
        ...

    def named_parameter_sample(self, names: list[str], n: int) -> dict[str, list[float]]:
        """The first `n` values of each named parameter, flattened (weight-sync verification)."""
        ...

    def named_tensors(self) -> dict:
        """Full CPU copies of every parameter under its Hugging Face name (tied ones once), in
        `named_parameters` order, on rank 0; {} on the other ranks (the `distributed` weight sync)."""
        ...

    def close(self) -> None:
        """Release the engine and any process group this backend created."""
        ...


def backend_lora(backend):
    """The LoraConfig `backend` trains with, or None (full fine-tuning, or a backend without LoRA)."""
    return getattr(backend, "lora", None)


def backend_class(training_config) -> type:
    """The TrainingBackend class `training_config.backend` names."""
    return load_class("training backend", training_config.backend, BACKENDS, "training.backend")


def build_backend(cls: type, model_path, training_config, temperature: float = 1.0):
    """`cls(model_path, training_config)`, told the sampling temperature (`inference.temperature`) so
    its log-probs, ratios and entropy are those of the distribution the engine sampled from
    (`log_softmax(logits / T)`, as SGLang returns them)."""
    check_temperature(cls, training_config, temperature)
    if temperature == 1.0:
        return cls(str(model_path), training_config)
    return cls(str(model_path), training_config, temperature=temperature)


def check_temperature(cls: type, training_config, temperature: float) -> None:
    """A backend whose constructor takes no `temperature` keyword can only train at 1.0: any other
    sampling temperature is refused, naming the fix."""
    if temperature != 1.0 and not _takes_keyword(cls, "temperature"):
        raise ConfigError(
            f"inference.temperature={temperature:g}, but the training backend {training_config.backend!r} takes no "
            "`temperature` keyword, so its log-probs would be at temperature 1 while the engine samples at "
            f"{temperature:g} (every ratio off before the first update)",
            "set inference.temperature: 1.0, or give the backend's __init__ a `temperature` keyword "
            "(PolicyRank._load_policy takes it)")


def _takes_keyword(cls: type, name: str) -> bool:
    import inspect

    params = inspect.signature(cls.__init__).parameters.values()
    return any(p.name == name or p.kind is p.VAR_KEYWORD for p in params)
