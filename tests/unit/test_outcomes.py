"""The status vocabularies are defined once (`agentrl_cli.core.outcomes`); every typed boundary agrees."""

from __future__ import annotations

from typing import get_args

from agentrl_cli.runtime.data.schema import OUTCOMES, REWARD_STATUSES
from agentrl_cli.core.outcomes import Outcome, RewardStatus, Termination, values
from agentrl_cli.runtime.reward.models import STATUSES, TERMINATIONS, RewardResult, ScoreRequest


def test_the_reward_models_accept_exactly_the_defined_statuses():
    assert get_args(RewardResult.model_fields["status"].annotation) == STATUSES == values(RewardStatus)[:4]
    assert get_args(RewardResult.model_fields["outcome"].annotation) == values(Outcome)
    assert get_args(ScoreRequest.model_fields["termination"].annotation) == TERMINATIONS


def test_the_stored_record_accepts_exactly_the_defined_outcomes_and_reward_statuses():
    assert OUTCOMES == values(Outcome) and REWARD_STATUSES == values(RewardStatus)


def test_members_are_their_strings():
    assert Termination.INFRA_ERROR == "infra_error" and f"termination_{Termination.TIMEOUT}" == "termination_timeout"
