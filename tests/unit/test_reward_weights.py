"""`reward.weights` over the reward's components: the reward is the weighted sum of the components,
so a weight of 0 (or none) leaves a component recorded with no effect, raising one weight by d raises
the reward by exactly d times that component's value, tampering and timeouts keep it at or below
zero whatever the weights, and a weight that names no component is refused at load with the names
that exist."""

from __future__ import annotations

import pytest

from agentrl_cli.config import load_config
from agentrl_cli.config.models import REWARD_COMPONENTS
from agentrl_cli.core.errors import ConfigError
from agentrl_cli.runtime.reward.aggregate import COMPONENTS
from agentrl_cli.runtime.reward.models import ScoreRequest
from agentrl_cli.runtime.reward.registry import FunctionVerifier
from agentrl_cli.runtime.reward.scorer import Scorer
from agentrl_cli.runtime.reward.verifiers import HarnessScoreVerifier, Verdict

EXTRA = "my_rewards:brevity"  # a reward.verifiers component, here a function in the test


class Fixed:
    """An outcome verifier with a fixed partial score."""

    name, version = "answer", "fixed"

    def __init__(self, score: float = 0.5, flags: list[str] | None = None) -> None:
        self.score, self.flags = score, flags or []

    def verify(self, req: ScoreRequest) -> Verdict:
        return Verdict(self.score, list(self.flags))


def request(termination: str = "done") -> ScoreRequest:
    """Four turns, one invalid; three tool calls, one illegal; `mix`, the harness scored 0.25."""
    steps = [{"action": "a", "tool_calls": [{"name": "ls"}, {"name": "rm", "status": "invalid_action"}]},
             {"action": "b", "tool_calls": [{"name": "cat"}]},
             {"action": "c"}, {"action": "???", "status": "invalid_action"}]
    return ScoreRequest.model_validate({
        "task": {"task_id": "t/1", "harness": "h", "prompt": "p", "answer": "4"}, "trajectory_id": "tr-1",
        "steps": steps, "termination": termination, "final_answer": "4", "reward_source": "mix", "harness_score": 0.25})


def scorer(weights: dict[str, float], *, outcome: Fixed | None = None, extra: float | Verdict = 0.375) -> Scorer:
    component = FunctionVerifier(EXTRA, lambda req: extra, "1")
    return Scorer({"answer": outcome or Fixed(), "harness": HarnessScoreVerifier()}, weights=weights, backoff_s=0.0,
                  components=[component])


def score(weights: dict[str, float], req: ScoreRequest | None = None, **kw):
    s = scorer(weights, **kw)
    try:
        result = s.score(req or request())
    finally:
        s.close()
    assert result.status != "infra_error", result.detail
    return result


BASE = {"outcome": 1.0, "format": 0.1, "tool_legality": 0.1, "turns_in_range": 0.2, "invalid_action_ratio": -0.3,
        "harness": 0.5, EXTRA: 0.4}
ALL = [*COMPONENTS, EXTRA]


def test_the_request_gives_every_component_a_distinct_nonzero_value():
    components = score(BASE).components
    assert components == {"outcome": 0.5, "format": 0.75, "tool_legality": pytest.approx(2 / 3), "turns_in_range": 1.0,
                          "invalid_action_ratio": 0.25, "harness": 0.25, EXTRA: 0.375}


def test_the_reward_is_the_weighted_sum_of_the_components():
    result = score(BASE)
    assert result.reward == pytest.approx(sum(w * result.components[name] for name, w in BASE.items()), abs=1e-12)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("d", [0.5, -0.25, 2.0])
def test_changing_one_weight_by_d_changes_the_reward_by_d_times_that_component(name, d):
    before = score(BASE)
    after = score({**BASE, name: BASE[name] + d})
    assert after.components == before.components
    assert after.reward - before.reward == pytest.approx(d * before.components[name], abs=1e-12)


@pytest.mark.parametrize("name", ALL)
def test_a_zero_weight_removes_a_components_effect_and_keeps_it_recorded(name):
    without = {k: w for k, w in BASE.items() if k != name}
    zero = score({**without, name: 0.0})
    assert zero.reward == pytest.approx(score(without).reward, abs=1e-12)
    assert zero.components[name] > 0.0  # recorded, nonzero, and still without effect
    assert score({name: 0.0}).reward == 0.0


def test_a_zero_weighted_component_does_not_move_the_reward_whatever_its_value():
    low, high = score({**BASE, EXTRA: 0.0}, extra=0.0), score({**BASE, EXTRA: 0.0}, extra=1.0)
    assert (low.components[EXTRA], high.components[EXTRA]) == (0.0, 1.0)
    assert low.reward == high.reward


@pytest.mark.parametrize("termination", ["timeout", "error"])
def test_a_timed_out_or_errored_episode_never_scores_above_zero_whatever_the_weights(termination):
    result = score({name: 5.0 for name in ALL}, request(termination), outcome=Fixed(1.0))
    assert result.reward <= 0.0 and result.components["outcome"] == 1.0


def test_a_tamper_flag_from_the_outcome_or_a_component_keeps_the_reward_at_or_below_zero():
    heavy = {name: 5.0 for name in ALL}
    assert score(heavy, outcome=Fixed(1.0, ["tamper"])).reward <= 0.0
    flagged = score(heavy, outcome=Fixed(1.0), extra=Verdict(1.0, ["tamper"], "edited the grader"))
    assert flagged.reward <= 0.0 and "tamper" in flagged.flags and "edited the grader" in flagged.detail


def test_the_scorer_refuses_a_weight_that_names_no_component():
    with pytest.raises(ValueError, match="outcom.*components: outcome, format"):
        scorer({"outcom": 1.0})


def config(*sets: str):
    return load_config(None, list(sets), env={}).config


def test_the_config_knows_exactly_the_aggregations_components():
    assert REWARD_COMPONENTS == COMPONENTS


def test_an_unknown_weight_is_refused_at_load_naming_the_components():
    with pytest.raises(ConfigError) as info:
        config('reward.weights={"outcome": 1.0, "fromat": 0.1}')
    message = info.value.message
    assert "reward.weights" in message and "fromat" in message
    assert all(name in message for name in COMPONENTS) and "reward.verifiers" in message


def test_weights_that_worked_keep_working_and_a_scorer_gets_its_own_weight():
    assert config().reward.weights == {"outcome": 1.0, "format": 0.1, "tool_legality": 0.1}
    every = {name: 0.5 for name in COMPONENTS}
    assert config(f"reward.weights={every}".replace("'", '"')).reward.weights == every
    cfg = config(f'reward.verifiers=["{EXTRA}"]', f'reward.weights={{"outcome": 1.0, "{EXTRA}": 0.5}}')
    assert cfg.reward.verifiers == [EXTRA] and cfg.reward.weights[EXTRA] == 0.5
    with pytest.raises(ConfigError, match="names no reward component: judge"):
        config('reward.weights={"outcome": 1.0, "judge": 0.5}')  # a scorer's weight needs the scorer
