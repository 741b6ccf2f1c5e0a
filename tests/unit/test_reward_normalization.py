"""`reward.normalization` as the step loop applies it (run/loop/samples.py's SampleBuilder): `group`
puts every task group's advantages on a unit scale, `window` puts every group on one scale set by the
recent rewards across steps, each against `none` on crafted rewards; and either with GRPO's own
per-group std scaling, which would undo it, is refused at load."""

from __future__ import annotations

import statistics
from types import SimpleNamespace

import pytest

from agentrl_cli.config import load_config
from agentrl_cli.core.errors import ConfigError
from agentrl_cli.core.outcomes import Outcome
from agentrl_cli.run.loop.samples import SampleBuilder
from agentrl_cli.runtime.rollout.buffer import Episode


def _builder(normalization: str) -> SampleBuilder:
    sets = [f"reward.normalization={normalization}", "training.advantage_std_scale=false"]
    return SampleBuilder(load_config(None, sets, env={}).config)


def _group(name: str, *rewards: float) -> list[Episode]:
    return [Episode(name, SimpleNamespace(token_ids=[1, 2, 3], loss_mask=[0, 1, 1], logprobs=[0.0] * 3, segment_starts=None,
                                          outcome=Outcome.FAIL), version=0, reward=r, tokens=2) for r in rewards]


def _advantages(builder: SampleBuilder, *groups: list[Episode]) -> list[float]:
    samples, _ = builder(list(groups), version=0)
    return [round(s.advantage, 4) for s in samples]


def test_group_normalization_gives_each_group_a_unit_scale_where_none_keeps_its_reward_differences():
    small, large = ("a", 0.0, 0.1), ("b", 0.0, 1.0)
    assert _advantages(_builder("none"), _group(*small), _group(*large)) == [-0.05, 0.05, -0.5, 0.5]
    assert _advantages(_builder("group"), _group(*small), _group(*large)) == [-1.0, 1.0, -1.0, 1.0]


def test_window_normalization_scales_every_group_by_the_spread_of_recent_rewards_across_steps():
    window, none = _builder("window"), _builder("none")
    first = [0.0, 1.0, 0.0, 1.0]
    assert _advantages(window, _group("a", 0.0, 1.0), _group("b", 0.0, 1.0)) == [-1.0, 1.0, -1.0, 1.0]  # spread 0.5
    # the next step's groups differ by 0.1 and 1.0: scaled by the window (both steps' rewards), not each by its own
    spread = statistics.pstdev(first + [0.0, 0.1, 0.0, 1.0])
    expected = [round(x / (spread + 1e-6), 4) for x in (-0.05, 0.05, -0.5, 0.5)]
    assert _advantages(window, _group("c", 0.0, 0.1), _group("d", 0.0, 1.0)) == expected
    assert _advantages(none, _group("c", 0.0, 0.1), _group("d", 0.0, 1.0)) == [-0.05, 0.05, -0.5, 0.5]
    assert expected[3] / expected[1] == pytest.approx(10, rel=1e-3)  # unlike `group` (1:1), the groups keep their 1:10


@pytest.mark.parametrize("normalization", ["group", "window"])
def test_a_normalization_that_std_scaled_advantages_would_undo_is_refused_naming_the_fix(normalization):
    with pytest.raises(ConfigError) as refused:
        load_config(None, [f"reward.normalization={normalization}"], env={})
    assert "has no effect with training.advantage_std_scale" in str(refused.value.message) + refused.value.hint
    assert "training.advantage_std_scale=false" in str(refused.value.message) + refused.value.hint
