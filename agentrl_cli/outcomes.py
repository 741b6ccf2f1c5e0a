"""The status vocabularies an episode crosses every boundary with, defined once.

`Termination`: why the rollout stopped an episode. `Outcome`: what the episode achieved, as stored
and reported. `RewardStatus`: whether the reward is a score (`ok`, `fail`, `timeout`) or must be
masked from training (`infra_error`: the infrastructure failed, never the agent's zero).
Members are `str`, so they compare equal to, serialize as and store as their values.
"""

from __future__ import annotations

from enum import StrEnum


class Termination(StrEnum):
    DONE = "done"  # the harness said the episode is over
    TRUNCATED = "truncated"  # cut at the step or sequence limit
    TIMEOUT = "timeout"  # an environment step or reset ran past its deadline
    ERROR = "error"  # the environment failed
    INFRA_ERROR = "infra_error"  # inference could not be finished; masked from training


class Outcome(StrEnum):
    SUCCESS = "success"
    PARTIAL = "partial"
    FAIL = "fail"
    TRUNCATED = "truncated"
    TIMEOUT = "timeout"
    ERROR = "error"


class RewardStatus(StrEnum):
    OK = "ok"
    FAIL = "fail"
    TIMEOUT = "timeout"
    INFRA_ERROR = "infra_error"
    UNSCORED = "unscored"  # stored before scoring (never trained on)


def values(enum: type[StrEnum]) -> tuple[str, ...]:
    return tuple(m.value for m in enum)
