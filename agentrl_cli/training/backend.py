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

from agentrl_cli.plugins import load_class
from agentrl_cli.training.grpo import Sample

BACKENDS: dict[str, str] = {  # training.backend names
    "deepspeed": "agentrl_cli.training.deepspeed_backend:DeepSpeedBackend",
}

STEP_METRICS = ("loss", "grad_norm", "clip_fraction", "approx_kl", "entropy", "mismatch_kl", "lr", "tokens", "samples")


@runtime_checkable
class TrainingBackend(Protocol):
    """A policy being trained on this rank. Every method that moves data between ranks (all but
    `step`, `rank`, `world_size`) must be called by all ranks together, in the same order."""

    step: int        # optimizer steps done (restored by load_checkpoint)
    rank: int        # this process's global rank
    world_size: int  # data-parallel ranks

    def train_step(self, samples: list[Sample]) -> dict:
        """One optimizer step on this rank's samples (gradients are averaged over ranks; each rank's
        loss is normalised by the token count over all ranks, so the mean over ranks is the step's
        loss, as one rank on the whole batch). Returns the metrics named in STEP_METRICS for this rank: loss, grad_norm (before clipping),
        clip_fraction, approx_kl, entropy, mismatch_kl (trainer vs inference log-probs before the
        update), lr, tokens (masked tokens), samples. The DeepSpeed backend adds the importance-weight
        diagnostics of `training.correction` (other than none) and `policy_lag` (corrections.py)."""
        ...

    def save_checkpoint(self, dir: Path, client_state: dict) -> None:
        """Write model, optimizer and `client_state` (the caller's own resume data) under `dir`."""
        ...

    def load_checkpoint(self, dir: Path) -> dict:
        """Restore what save_checkpoint wrote under `dir`; returns its client_state."""
        ...

    def export_weights(self, dir: Path) -> Path:
        """Write an ordinary Hugging Face model directory (config, safetensors, tokenizer files) that
        AutoModelForCausalLM.from_pretrained loads; returns its path."""
        ...

    def parameter_names(self) -> list[tuple[str, tuple[int, ...]]]:
        """(name, full shape) of every parameter, tied parameters under each of their names."""
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


def backend_class(training_config) -> type:
    """The TrainingBackend class `training_config.backend` names."""
    return load_class("training backend", training_config.backend, BACKENDS, "training.backend")
