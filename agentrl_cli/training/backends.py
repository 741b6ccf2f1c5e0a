"""Choose the trainer backend for a run: one DeepSpeed rank in this process, or
`training.world_size` ranks started through a launcher (`ranks_backend.py`)."""

from __future__ import annotations

from pathlib import Path


def make_backend(model_path: str | Path, cfg, run_dir: Path):
    """A `TrainingBackend` for the platform config `cfg`."""
    if cfg.training.world_size == 1:
        import torch

        from agentrl_cli.inference.launcher import cpu_thread_split
        from agentrl_cli.training.deepspeed_backend import DeepSpeedBackend

        if not torch.cuda.is_available():  # this process shares the host's cores with the embedded servers
            torch.set_num_threads(cpu_thread_split(cfg)[0])
        return DeepSpeedBackend(str(model_path), cfg.training)
    from agentrl_cli.training.ranks_backend import RanksBackend

    return RanksBackend(str(model_path), cfg, Path(run_dir))
