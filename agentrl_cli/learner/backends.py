"""How a run gets the trainer backend `training.backend` names (`backend.backend_class`): built
as `Class(model_path, training_config)` in this process when `training.world_size` is 1, else on
every rank started by the launcher (`ranks_backend.py` drives them, `rank_worker.py` builds each
rank's backend through the same registry).
"""

from __future__ import annotations

from pathlib import Path

from agentrl_cli.core.errors import ConfigError
from agentrl_cli.learner.backend import backend_class, build_backend, check_temperature


def make_backend(model_path: str | Path, cfg, run_dir: Path):
    """A `TrainingBackend` for the platform config `cfg`."""
    cls = backend_class(cfg.training)
    check_temperature(cls, cfg.training, cfg.inference.temperature)  # before any rank starts
    if cfg.training.lora is not None and not hasattr(cls, "export_adapter"):
        raise ConfigError(f"training.lora is set but the training backend {cfg.training.backend!r} has no "
                          "export_adapter, so it cannot train or sync an adapter",
                          "unset training.lora, or use training.backend: deepspeed (or a backend with LoRA support)")
    if cfg.training.world_size == 1:
        import torch

        from agentrl_cli.engines.inference.launcher import cpu_thread_split

        if not torch.cuda.is_available():  # this process shares the host's cores with the embedded servers
            torch.set_num_threads(cpu_thread_split(cfg)[0])
        return build_backend(cls, model_path, cfg.training, cfg.inference.temperature)
    from agentrl_cli.learner.ranks_backend import RanksBackend

    return RanksBackend(str(model_path), cfg, Path(run_dir))
