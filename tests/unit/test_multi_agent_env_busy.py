"""A multi-agent harness whose environment refuses an episode at capacity gets the single-agent
episode's backpressure: refused past rollout.env_busy_timeout_s, every policy role's record is
masked (environment_busy), never a harness error, never an episode error that loses the draw. (Waited
out and played again: tests/integration/test_multi_agent_rollout.py, which has a server to play with.)"""

from __future__ import annotations

import asyncio

from agentrl_cli.config import load_config
from agentrl_cli.config.load import with_overrides
from agentrl_cli.core.errors import EnvironmentBusy
from agentrl_cli.runtime.reward.client import LocalRewardClient
from agentrl_cli.runtime.reward.scorer import Scorer
from agentrl_cli.runtime.rollout.buffer import TrajectoryBuffer
from agentrl_cli.runtime.rollout.controller import RolloutController
from agentrl_cli.runtime.rollout.sampler import Draw, TaskSampler
from harnesses.guess_number import GuessNumber

TASK = GuessNumber.task_set().select("train")[0]


class BusyGuess(GuessNumber):
    """guess_number behind a server that refuses the first `refusals` sessions at capacity."""

    refusals = 0

    def reset(self, task):
        if BusyGuess.refusals > 0:
            BusyGuess.refusals -= 1
            raise EnvironmentBusy("Server at capacity: 1/1 sessions active (code: CAPACITY_REACHED)", capacity=1)
        return super().reset(task)


def controller(roles: dict, busy_timeout_s: float, client=None, tokenizer=None) -> RolloutController:
    cfg = load_config(None, ["rollout.concurrency=2", "rollout.env_create_backoff_s=0.001",
                             f"rollout.env_busy_timeout_s={busy_timeout_s}"], env={}).config
    cfg = with_overrides(cfg, {"harnesses": [{"name": "guess_number", "roles": roles}]}, "test")
    sampler = TaskSampler({"guess_number": [TASK]}, group_size=1, seed=1)
    return RolloutController(cfg, client, tokenizer, LocalRewardClient(Scorer()), sampler, TrajectoryBuffer(4, 1, 1),
                             run_id="busy", make_harness=lambda name: BusyGuess())


def play(ctl: RolloutController):
    try:
        return asyncio.run(ctl.play_roles(Draw(TASK, "g0", 0, 0)))
    finally:
        ctl.close()


def test_refused_past_the_busy_timeout_every_policy_role_is_masked_as_environment_busy_not_a_harness_error():
    ctl = controller({"holder": "scripted"}, busy_timeout_s=0)  # the guesser is the policy's
    BusyGuess.refusals = 1000
    [guesser] = play(ctl)
    assert guesser.role == "guesser" and guesser.scored.masked and "environment_busy" in guesser.scored.flags
    assert guesser.record.role == "guesser" and "environment busy" in guesser.result.error
    assert ctl.counters["env/guess_number/backpressure"] >= 1 and ctl.counters["termination_infra_error"] == 1
    assert not any("harness_error" in k for k in ctl.counters)
