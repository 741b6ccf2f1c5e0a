"""The trainer computes its log-probs at the temperature the engine sampled at (`inference.temperature`):
a backend built for a run is told it, on one rank in this process and on every launched rank, and a
backend that cannot take it is refused at load. Found on SmolLM2 at temperature 0.8, where the trainer
was at 1.0: 30% of tokens clipped at the first step, before any update."""

from __future__ import annotations

import pytest

from agentrl_cli.config.models import PlatformConfig
from agentrl_cli.core.errors import ConfigError
from agentrl_cli.learner.backend import build_backend, check_temperature
from agentrl_cli.learner.ranks_backend import launcher_command


class _Takes:
    def __init__(self, model_path, training_config, *, temperature: float = 1.0):
        self.temperature = temperature


class _Plain:
    def __init__(self, model_path, training_config):
        self.built = True


def _cfg(**inference):
    return PlatformConfig.model_validate({"inference": inference, "training": {"world_size": 2}})


def test_a_backend_is_built_at_the_sampling_temperature():
    cfg = _cfg(temperature=0.8)
    assert build_backend(_Takes, "m", cfg.training, cfg.inference.temperature).temperature == 0.8
    assert build_backend(_Takes, "m", cfg.training).temperature == 1.0


def test_a_backend_without_the_keyword_is_refused_off_temperature_one_and_built_at_one():
    cfg = _cfg(temperature=0.8)
    with pytest.raises(ConfigError, match=r"inference.temperature=0.8.*takes no `temperature` keyword") as e:
        check_temperature(_Plain, cfg.training, 0.8)
    assert "inference.temperature: 1.0" in e.value.hint
    assert build_backend(_Plain, "m", cfg.training, 1.0).built


def test_every_launched_rank_is_told_the_temperature(tmp_path):
    argv = launcher_command(_cfg(temperature=0.7), tmp_path / "m", tmp_path / "c")
    assert argv[argv.index("--temperature") + 1] == "0.7"
