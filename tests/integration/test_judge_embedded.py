"""The `judge` verifier with the embedded inference server (a random tiny model, and under the
`builtin` marker the built-in model; behind an API key) as its judge, over its OpenAI-compatible /v1: the model is found through /v1/models, the key is
sent, the prompt fits and is answered, and a reply that is no verdict (all a random model writes,
and all the built-in model writes: it answers the rubric with "ANSWER: ..." as it was taught)
is infra_error, masked, never a score and never cached; a shuffled group is the very same prompt
(the server's prefix cache serves all of it again, and a group that differs is not served whole);
the run's own server is the judge when reward.judge.url is unset; a stopped server is an outage."""

from __future__ import annotations

import pytest

from agentrl_cli.config.models import InferenceConfig, JudgeConfig, PlatformConfig, RewardConfig, RolloutConfig
from agentrl_cli.runtime.reward.judge import JudgeVerifier
from agentrl_cli.runtime.reward.models import ScoreRequest, StepIn, TaskIn
from agentrl_cli.runtime.reward.scorer import Scorer
from agentrl_cli.runtime.reward.verifiers import VerifierError

pytestmark = [pytest.mark.integration]
KEY = "judge-key-0123456789"


def _builtin_model() -> str:
    from agentrl_cli.config import load_config
    from agentrl_cli.model.resolve import builtin_dir
    from agentrl_cli.model.tiny import is_complete

    path = builtin_dir(load_config(None, [], env={}).config.model.cache_dir)
    if not is_complete(path):
        pytest.skip("the built-in model is not built (agentrl model build-tiny)")
    return str(path)


@pytest.fixture(scope="module", params=["random", pytest.param("builtin", marks=pytest.mark.builtin)])
def served(request, random_model_dir):
    from agentrl_cli.engines.inference.engine import HFEngine
    from agentrl_cli.engines.inference.hf_server import create_app
    from agentrl_cli.core.serving import ServerThread

    model = random_model_dir if request.param == "random" else _builtin_model()
    engine = HFEngine(model, batch_window_ms=5, prefix_cache_tokens=8192)
    srv = ServerThread(create_app(engine, api_key=KEY), name="hf-judge").start()
    yield engine, srv
    srv.stop()
    engine.close()


def request(answer: str, index: int = 0) -> ScoreRequest:
    return ScoreRequest(task=TaskIn(task_id="t1", harness="h", prompt="What is 6*7?", answer=42, meta={"verify": "judge"}),
                        trajectory_id=f"run-smoke-g0-0000001-{index}", steps=[StepIn(action="multiply")],
                        final_answer=answer)


def config(url: str | None, inference: InferenceConfig | None = None, **judge) -> PlatformConfig:
    return PlatformConfig(reward=RewardConfig(timeout_s=60, max_retries=0, judge_api_key=KEY if url else None,
                                              judge=JudgeConfig(url=url, max_tokens=16, timeout_s=30, **judge)),
                          inference=inference or InferenceConfig(), rollout=RolloutConfig(group_size=3))


def test_the_embedded_server_judges_and_an_unusable_reply_is_masked(served):
    _, srv = served
    judge = JudgeVerifier(config(f"{srv.url}/v1"))
    scorer = Scorer({"judge": judge}, timeout_s=60, max_retries=0)
    result = scorer.score(request("42"))
    assert judge.calls == 1 and judge._model  # the served model's name, read from /v1/models
    assert result.masked and result.status == "infra_error" and result.reward == 0.0
    assert "no JSON object" in result.detail and "HTTP" not in result.detail  # answered (200), just no verdict
    assert scorer.score(request("42")).attempts == 1 and judge.calls == 2  # never cached: asked again
    scorer.close()


def test_a_shuffled_group_is_the_same_prompt(served):
    engine, srv = served
    judge = JudgeVerifier(config(f"{srv.url}/v1", mode="group"))
    reqs = [request(a, i) for i, a in enumerate(["42", "41", "6*7"])]

    def prompt_and_cached(group) -> tuple[int, int]:
        before = (engine.stats.prompt_tokens_total, engine.stats.cached_tokens_total)
        with pytest.raises(VerifierError, match="no JSON object"):
            judge.verify_group(group)
        return engine.stats.prompt_tokens_total - before[0], engine.stats.cached_tokens_total - before[1]

    first, _ = prompt_and_cached(reqs)
    again, cached = prompt_and_cached([reqs[2], reqs[0], reqs[1]])
    assert again == first and cached >= first - 1  # every prompt token (the last is always computed) was cached
    changed, cached_changed = prompt_and_cached([request("43", 0), reqs[1], reqs[2]])
    assert cached_changed < changed - 1  # the measure tells prompts apart: another group is not served whole


def test_unset_url_is_the_runs_own_server_and_a_stopped_server_is_an_outage(served):
    from agentrl_cli.engines.inference.hf_server import create_app
    from agentrl_cli.core.serving import ServerThread

    engine, _ = served
    srv = ServerThread(create_app(engine, api_key=KEY), name="hf-run").start()
    judge = JudgeVerifier(config(None, InferenceConfig(urls=[srv.url], api_key=KEY)))
    assert judge.base_url == f"{srv.url}/v1"
    try:
        with pytest.raises(VerifierError, match="no JSON object"):  # reached and answered, with the run's key
            judge.verify(request("42"))
    finally:
        srv.stop()
    with pytest.raises(VerifierError, match="unreachable"):
        judge.verify(request("41"))
