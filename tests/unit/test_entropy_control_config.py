"""training.entropy_target's knobs take effect only with a target: given without one they are refused
at load, naming the key to set (learner/policy_rank.py moves the bonus; test_deepspeed_backend.py
shows it move)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from agentrl_cli.config.models import TrainingConfig


@pytest.mark.parametrize("knob", [{"entropy_coef_step": 0.01}, {"entropy_coef_max": 0.5}])
def test_a_control_knob_without_a_target_is_refused(knob):
    with pytest.raises(ValidationError, match="only take effect with entropy_target"):
        TrainingConfig(**knob)
    assert TrainingConfig(entropy_target=0.5, **knob).entropy_target == 0.5


def test_the_starting_bonus_must_fit_under_the_cap():
    with pytest.raises(ValidationError, match=r"entropy_coef \(0.2\).*entropy_coef_max \(0.1\)"):
        TrainingConfig(entropy_target=0.5, entropy_coef=0.2)
    assert TrainingConfig(entropy_coef=0.2).entropy_target is None  # no target: a fixed bonus of any size
