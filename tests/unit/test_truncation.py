"""`rollout.truncation` decides what the trainer sees of an episode cut at the step or sequence limit."""

from __future__ import annotations

import pytest

from agentrl_cli.runtime.rollout.controller import TRUNCATION_PENALTY, trained_reward


@pytest.mark.parametrize("mode, expected", [("mask", None), ("score", 0.3), ("penalize", TRUNCATION_PENALTY)])
def test_a_truncated_episode_is_masked_scored_or_penalized(mode, expected):
    assert trained_reward(mode, truncated=True, masked=False, reward=0.3) == expected


@pytest.mark.parametrize("mode", ["mask", "score", "penalize"])
def test_finished_episodes_keep_their_reward_and_masked_ones_stay_masked(mode):
    assert trained_reward(mode, truncated=False, masked=False, reward=0.7) == 0.7
    assert trained_reward(mode, truncated=True, masked=True, reward=0.7) is None
    assert TRUNCATION_PENALTY < 0  # below any finished episode's reward
