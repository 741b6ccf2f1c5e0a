"""`harnesses[].reward`: the harness's own compute_reward as the training reward, or mixed with the
task's verifier, judged by the same rules in-process and through the HTTP reward service: the same
content gets the same cached result, a score outside [0, 1] is infra_error (masked, never a zero),
a `tamper` flag or an edited protected file scores 0, and `mix` adds the `harness` component with
its weight."""

from __future__ import annotations

import hashlib

import pytest

from agentrl_cli.config import load_config
from agentrl_cli.core.errors import ConfigError
from agentrl_cli.runtime.reward.client import HttpRewardClient
from agentrl_cli.runtime.reward.request_from_episode import request_from_episode
from agentrl_cli.runtime.reward.scorer import Scorer
from agentrl_cli.runtime.reward.service import create_app
from agentrl_cli.core.serving import ServerThread
from harnesses.base import Action, Evidence, HarnessReward, Observation, TaskSpec, Trajectory
from harnesses.registry import reward_source
from tests.conftest import free_port

pytestmark = [pytest.mark.integration]

TASK = TaskSpec(task_id="t/0", harness="h", prompt="say 4", answer="4", difficulty=1, split="train", meta={"verify": "answer"})


def request(score: float | None, *, source: str = "harness", flags=(), answer: str = "4", evidence: Evidence | None = None):
    traj = Trajectory(task=TASK, actions=[Action(text=f"ANSWER: {answer}")],
                      observations=[Observation(text="say 4"), Observation(text="ok", done=True)])
    reward = None if score is None else HarnessReward(score, list(flags), "graded by the harness")
    return request_from_episode(traj, evidence or Evidence(final_answer=answer), trajectory_id="traj-1",
                                reward_source=source, harness_reward=reward)


@pytest.fixture(scope="module")
def scorers():
    local = Scorer(backoff_s=0.0, weights={"outcome": 1.0, "harness": 0.5})
    served = Scorer(backoff_s=0.0, weights={"outcome": 1.0, "harness": 0.5})
    server = ServerThread(create_app(served), port=free_port(), name="reward").start()
    yield {"in-process": local.score, "service": HttpRewardClient(server.url).score}
    server.stop()
    local.close()
    served.close()


@pytest.mark.parametrize("where", ["in-process", "service"])
def test_the_harness_score_is_the_outcome_and_is_cached_by_content(scorers, where):
    score = scorers[where]
    first = score(request(0.25, answer="7"))  # the answer verifier would give 0: the harness's score counts
    assert first.verifier == "harness" and first.components["outcome"] == 0.25 and first.reward == 0.25
    again = score(request(0.25, answer="7"))
    assert again.cached and again.idempotency_key == first.idempotency_key
    assert score(request(0.5, answer="7")).idempotency_key != first.idempotency_key


@pytest.mark.parametrize("where", ["in-process", "service"])
def test_a_harness_score_outside_zero_one_is_masked_never_a_zero(scorers, where):
    result = scorers[where](request(3.0))
    assert result.status == "infra_error" and result.masked and "outside [0, 1]" in result.detail


@pytest.mark.parametrize("where", ["in-process", "service"])
def test_tampering_scores_nothing_whatever_the_harness_said(scorers, where):
    flagged = scorers[where](request(1.0, flags=["tamper"]))
    assert flagged.reward <= 0.0 and "tamper" in flagged.flags and flagged.status == "fail"
    protected = Evidence(final_answer="4", files={"tests/test.sh": b"exit 0"},
                         protected={"tests/test.sh": hashlib.sha256(b"the original").hexdigest()})
    edited = scorers[where](request(1.0, evidence=protected))
    assert edited.reward <= 0.0 and "tamper" in edited.flags


@pytest.mark.parametrize("where", ["in-process", "service"])
def test_mix_adds_the_harness_component_with_its_weight(scorers, where):
    result = scorers[where](request(0.5, source="mix"))  # answer 4 is right: outcome 1, harness 0.5 x weight 0.5
    assert result.components["outcome"] == 1.0 and result.components["harness"] == 0.5
    assert result.reward == pytest.approx(1.0 + 0.5 * 0.5)
    missing = scorers[where](request(None, source="mix"))
    assert missing.status == "infra_error" and "no harness_score" in missing.detail


class Unscored:
    name, version = "unscored", "1"

    def reset(self, task):
        return Observation(text=task.prompt)

    def step(self, action):
        return Observation(text="ok", done=True)

    def close(self):
        pass


def test_reward_harness_needs_a_compute_reward_and_mix_needs_a_weight():
    harnesses = f'[{{"name": "{__name__}:Unscored", "reward": "harness", "tasks": "x.jsonl"}}]'
    cfg = load_config(None, [f"harnesses={harnesses}"], env={}).config
    with pytest.raises(ConfigError, match="defines no compute_reward"):
        reward_source(cfg.harnesses[0])
    with pytest.raises(ConfigError, match="reward.weights has no `harness` weight"):
        load_config(None, ['harnesses=[{"name": "terminal_like", "reward": "mix"}]'], env={})
