"""User reward functions (`module:function`, agentrl_cli/runtime/reward/registry.py) scored in-process and by
`agentrl serve reward` started for real on 127.0.0.1 from the same config: as a task's outcome
(`meta.verify`) and as a `reward.verifiers` component, they give identical results in both places,
and both apply the same rules: version in the cache key, the scorer's deadline, an exception or a
score outside [0, 1] masked as infra_error and counted, a tampered trajectory never above zero."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from agentrl_cli.config import load_config
from agentrl_cli.runtime.reward.client import HttpRewardClient, LocalRewardClient
from agentrl_cli.runtime.reward.models import ScoreRequest
from agentrl_cli.runtime.reward.scorer import Scorer
from tests.conftest import free_port

pytestmark = [pytest.mark.integration]

MODULE = "user_rewards_it"
SOURCE = '''
import threading

RELEASE = threading.Event()  # the in-process test sets it so a slow call ends with the test


def keyword(req):
    """The outcome: 1 when the final answer names the task's answer, else 0.25 for trying."""
    return 1.0 if str(req.task.answer) in (req.final_answer or "") else 0.25


def brevity(req):
    """A component: shorter episodes score higher."""
    return 1.0 / len(req.steps) if req.steps else 0.0
brevity.__version__ = "b1"


def crash(req):
    raise RuntimeError("the grader fell over")


def too_big(req):
    return 1.5


def slow(req):
    RELEASE.wait(20)
    return 1.0
'''
SETS = [f'reward.verifiers=["{MODULE}:brevity"]', f'reward.weights={{"outcome": 1.0, "format": 0.1, "{MODULE}:brevity": 0.5}}',
        "reward.timeout_s=1.5", "reward.max_retries=1"]


def req(verify: str = "keyword", *, steps: int = 2, answer: str = "4", tid: str = "tr-1", **kw) -> ScoreRequest:
    return ScoreRequest.model_validate({
        "task": {"task_id": "t/1", "harness": "h", "prompt": "2+2?", "answer": "4", "meta": {"verify": f"{MODULE}:{verify}"}},
        "trajectory_id": tid, "steps": [{"action": f"step {i}"} for i in range(steps)], "final_answer": answer, **kw})


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("user_rewards")
    (where / f"{MODULE}.py").write_text(textwrap.dedent(SOURCE))
    sys.path.insert(0, str(where))
    yield where
    sys.path.remove(str(where))


@pytest.fixture(scope="module")
def service(user_dir):
    """`agentrl serve reward` with the user's module on its PYTHONPATH; yields its URL."""
    port = free_port()
    sets = [a for s in SETS for a in ("--set", s)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTRL_")}
    env["PYTHONPATH"] = os.pathsep.join([str(user_dir), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    agentrl = Path(sys.executable).parent / "agentrl"
    proc = subprocess.Popen([str(agentrl), "serve", "reward", "--host", "127.0.0.1", "--port", str(port), *sets],
                            cwd=user_dir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"agentrl serve reward exited {proc.returncode}: {proc.stderr.read()[-2000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("agentrl serve reward did not answer /health within 60 s")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def local(user_dir):
    scorer = Scorer.from_config(load_config(None, SETS, env={}).config)
    yield scorer
    sys.modules[MODULE].RELEASE.set()
    scorer.close()


@pytest.fixture(scope="module")
def clients(local, service):
    http = HttpRewardClient(service, timeout_s=10.0, max_retries=0)
    yield {"in-process": LocalRewardClient(local), "service": http}
    http.close()


WHERE = ["in-process", "service"]


@pytest.mark.parametrize("where", WHERE)
def test_a_function_is_the_outcome_and_another_a_weighted_component(clients, where):
    result = clients[where].score(req(steps=2))
    brevity = f"{MODULE}:brevity"
    assert (result.status, result.outcome, result.verifier) == ("ok", "success", f"{MODULE}:keyword")
    assert result.components["outcome"] == 1.0 and result.components[brevity] == 0.5
    assert result.reward == pytest.approx(1.0 + 0.1 * 1.0 + 0.5 * 0.5)
    assert result.verifier_versions[brevity] == "b1" and result.verifier_versions[f"{MODULE}:keyword"].startswith("src-")
    partial = clients[where].score(req(steps=4, answer="5", tid="tr-2"))
    assert partial.components["outcome"] == 0.25 and partial.components[brevity] == 0.25 and partial.outcome == "partial"


@pytest.mark.parametrize("where", WHERE)
def test_the_same_content_gets_the_cached_result_with_the_same_key(clients, where):
    first = clients[where].score(req(steps=3, tid="tr-cache"))
    again = clients[where].score(req(steps=3, tid="tr-cache"))
    assert again.cached and again.idempotency_key == first.idempotency_key and again.reward == first.reward


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("verify, said", [("crash", "crashed: RuntimeError: the grader fell over"),
                                          ("too_big", "outside [0, 1]"), ("slow", "past its 1.5 s deadline")])
def test_a_crash_a_score_outside_zero_one_or_a_deadline_is_masked_never_a_score(clients, where, verify, said):
    result = clients[where].score(req(verify, tid=f"tr-{verify}"))
    assert result.status == "infra_error" and result.masked and result.reward == 0.0 and not result.cached
    assert said in result.detail and result.attempts == 2 and "infra_error" in result.flags


@pytest.mark.parametrize("where", WHERE)
def test_a_tampered_trajectory_never_scores_above_zero(clients, where):
    protected = {"tests/test.sh": hashlib.sha256(b"the original").hexdigest()}
    files = [{"path": "tests/test.sh", "content_b64": base64.b64encode(b"exit 0").decode()}]
    result = clients[where].score(req(files=files, protected=protected, tid="tr-tamper"))
    assert result.reward <= 0.0 and "tamper" in result.flags and result.components["outcome"] == 0.0


def test_in_process_and_the_service_give_identical_results(local, clients, service):
    reqs = [req(steps=1, tid="same-1"), req(steps=5, answer="no", tid="same-2"), req("crash", tid="same-3"),
            req(steps=2, tid="same-4", termination="timeout")]
    ours = [clients["in-process"].score(r).model_dump() for r in reqs]
    theirs = [r.model_dump() for r in clients["service"].score_batch(reqs)]
    assert ours == theirs
    info = httpx.get(f"{service}/info", timeout=10).json()
    assert info["verifier_versions"] == local.versions() and info["components"] == [f"{MODULE}:brevity"]
    metrics = httpx.get(f"{service}/metrics", timeout=10).text
    assert "agentrl_reward_infra_errors_total" in metrics and local.counters["infra_errors"] >= 1
