"""The status vocabularies an episode crosses every boundary with, defined once.

`Termination`: why the rollout stopped an episode. `Outcome`: what the episode achieved, as stored
and reported. `RewardStatus`: whether the reward is a score (`ok`, `fail`, `timeout`) or must be
masked from training (`infra_error`: the infrastructure failed, never the agent's zero). `Phase`:
which loop of a run played the episode, recorded with every trajectory (and the trajectory id).
Members are `str`, so they compare equal to, serialize as and store as their values.
A check's status is `report.CheckStatus`; the names of metrics are `runtime/observe/keys.py`'s.
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


class Phase(StrEnum):
    """The loop that recorded a trajectory: what the run's readers filter by."""

    TRAIN = "train"  # a training run started outside the runbook
    EVAL = "eval"  # evaluation episodes played on their own (stage 7's)
    BASELINE = "baseline"  # stage 0's loop, and verify measuring it again
    SMOKE = "smoke"  # stage 8's three phases (`agentrl stage run 8 --phase ...`)
    SHORT = "short"
    FULL = "full"
    VERIFY = "verify"  # verify's own verification run
    VERIFY_RESUME = "verify-resume"  # verify's resume probe, one step on a copied checkpoint
    PROBE = "probe"  # stage 5's episodes through the training path, one per harness (never trained on)


STAGE8_PHASES = (Phase.SMOKE, Phase.SHORT, Phase.FULL)


def values(enum: type[StrEnum]) -> tuple[str, ...]:
    return tuple(m.value for m in enum)
