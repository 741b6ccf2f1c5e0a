"""The reward: deterministic and idempotent scoring, explicit errors for malformed input, tamper
and early-exit detection by the hidden-test verifier, infra_error kept apart from fail, null/gold
quarantine, and the HTTP service and client (docs/security.md rows 15-19, 24)."""

from __future__ import annotations

import threading

import httpx
import pytest

from agentrl_cli.runtime.reward.client import HttpRewardClient, LocalRewardClient, RewardRequestError
from agentrl_cli.runtime.reward.request_from_episode import request_from_episode
from agentrl_cli.runtime.reward.gold import check_task, quarantine_failing
from agentrl_cli.runtime.reward.models import ScoreRequest
from agentrl_cli.runtime.reward.scorer import Scorer
from agentrl_cli.runtime.reward.service import create_app
from agentrl_cli.runtime.reward.verifiers import Verdict, VerifierError, default_verifiers
from agentrl_cli.envs.sandbox import SandboxSettings
from agentrl_cli.core.serving import ServerThread
from harnesses.base import Action, Trajectory
from harnesses.contract import play
from harnesses.registry import resolve
from agentrl_cli.envs.sandbox.provider import DirectProvider
from harnesses.tasks import HARNESS_FAMILIES, load_tasks
from tests.conftest import free_port
from tests.integration.conftest import needs_bwrap

pytestmark = [pytest.mark.integration, needs_bwrap]


@pytest.fixture(scope="module")
def provider():
    return DirectProvider(SandboxSettings())


@pytest.fixture
def scorer(provider):
    s = Scorer(provider=provider, backoff_s=0.01)
    yield s
    s.close()


@pytest.fixture(scope="module")
def code_harness(provider):
    h = resolve("code_sandbox_like")(sandboxes=provider)
    yield h
    h.close()


def episode_request(harness, task, actions: list[str], tid: str = "t-1") -> ScoreRequest:
    traj = Trajectory(task=task)
    traj.observations.append(harness.reset(task))
    for text in actions:
        traj.actions.append(Action(text=text))
        traj.observations.append(harness.step(traj.actions[-1]))
    return request_from_episode(traj, harness.evidence(traj), trajectory_id=tid)


def write_solution(source: str) -> str:
    return f"```python\nopen('solution.py', 'w').write({source!r})\n```"


LIST_KINDS = ("sum_even", "count_negative", "max_minus_min")


# ---- determinism and idempotency ----------------------------------------------------------------

@pytest.mark.parametrize("name", ["terminal_like", "code_sandbox_like", "tool_api_like"])
def test_oracle_episode_scores_success_and_agrees_with_the_harness(name, provider, scorer):
    h = resolve(name)(sandboxes=provider) if name != "tool_api_like" else resolve(name)()
    try:
        for family in HARNESS_FAMILIES[name]:
            task = load_tasks(name, "eval", family)[0]
            traj, _ = play(h, task)
            req = request_from_episode(traj, h.evidence(traj), trajectory_id=f"{task.task_id}-a")
            result = scorer.score(req)
            assert (result.status, result.outcome, result.components["outcome"]) == ("ok", "success", 1.0), result.detail
            assert result.components["outcome"] == h.compute_reward(traj)
            assert result.reward == pytest.approx(1.0 + 0.1 + 0.1)
    finally:
        h.close()


def test_the_terse_demonstration_style_solves_every_code_family_too(code_harness, scorer):
    """The warm start plays one task in four in this style (`model/demos.py`): it must be as correct."""
    from harnesses.oracle import oracle_action, terse_action

    for kind in LIST_KINDS + ("arith",):
        family = "arith" if kind == "arith" else "list_function"
        task = next(t for t in load_tasks("code_sandbox_like", "train", family) if t.meta.get("kind", "arith") == kind)
        assert len(terse_action(task, 0)) < len(oracle_action(task, 0))
        traj, _ = play(code_harness, task, policy=terse_action)
        result = scorer.score(request_from_episode(traj, code_harness.evidence(traj), trajectory_id=f"{task.task_id}-terse"))
        assert (result.status, result.outcome) == ("ok", "success"), result.detail


def test_the_demonstrations_slip_fails_the_hidden_tests_in_every_family_that_has_it(provider, code_harness, scorer):
    """Three warm-start demonstrations in five carry it (`model/demos.py`): only the reward can tell."""
    from harnesses.oracle import slip_action, terse_slip_action

    terminal = resolve("terminal_like")(sandboxes=provider)
    try:
        cases = [(code_harness, t, policy) for t in (load_tasks("code_sandbox_like", "train", "arith")[0],
                                                     load_tasks("code_sandbox_like", "train", "list_function")[0])
                 for policy in (slip_action, terse_slip_action)]
        cases.append((terminal, load_tasks("terminal_like", "train", "uppercase_file")[0], slip_action))
        for harness, task, policy in cases:
            traj, _ = play(harness, task, policy=policy)
            result = scorer.score(request_from_episode(traj, harness.evidence(traj), trajectory_id=f"{task.task_id}-slip"))
            assert result.outcome == "fail" and result.status in ("ok", "fail"), (task.task_id, policy.__name__, result.detail)
            assert result.reward < 1.0
    finally:
        terminal.close()


def test_same_trajectory_scored_twice_gives_the_identical_result(code_harness, scorer):
    task = load_tasks("code_sandbox_like", "eval", "list_function")[0]
    req = episode_request(code_harness, task, [write_solution("def solve(xs):\n    return 0\n"), "SUBMIT"])
    first, second = scorer.score(req), Scorer(provider=scorer.verifiers["tests"].provider).score(req)
    assert first.model_dump(exclude={"cached"}) == second.model_dump(exclude={"cached"})
    assert not first.cached and not second.cached  # two scorers: both really ran the tests
    again = scorer.score(req)
    assert again.cached and again.model_dump(exclude={"cached"}) == first.model_dump(exclude={"cached"})
    assert scorer.counters["cache_hits"] == 1


def test_idempotency_key_changes_with_content_and_verifier_version(code_harness, scorer):
    task = load_tasks("terminal_like", "eval", "arith")[0]
    req = ScoreRequest.model_validate({"task": {"task_id": task.task_id, "harness": task.harness, "prompt": task.prompt,
                                                "answer": task.answer, "meta": task.meta},
                                       "trajectory_id": "x", "steps": [{"action": "ANSWER: 3"}], "final_answer": "3"})
    k1 = scorer.score(req).idempotency_key
    k2 = scorer.score(req.model_copy(update={"final_answer": "4"})).idempotency_key
    bumped = default_verifiers(None)
    bumped["answer"].version = "2"
    k3 = Scorer(bumped).score(req).idempotency_key
    assert len({k1, k2, k3}) == 3


# ---- tampering (rows 16, 17) --------------------------------------------------------------------

def _arith(code_harness):
    task = load_tasks("code_sandbox_like", "eval", "arith")[0]
    return task, f"def solve():\n    return {task.answer}\n"


def test_honest_solution_passes_without_flags(code_harness, scorer):
    task, good = _arith(code_harness)
    r = scorer.score(episode_request(code_harness, task, [write_solution(good), "SUBMIT"]))
    assert (r.status, r.outcome, r.flags) == ("ok", "success", [])


@pytest.mark.parametrize("attack", [
    "```python\nopen('test_solution.py', 'w').write('def test_ok():\\n    pass\\n')\n```",
    "```python\nimport os\nos.remove('test_solution.py')\n```",
])
def test_editing_or_deleting_the_visible_test_gets_zero_and_a_tamper_flag(attack, code_harness, scorer):
    task, good = _arith(code_harness)
    r = scorer.score(episode_request(code_harness, task, [write_solution(good), attack, "SUBMIT"]))
    assert r.reward <= 0.0 and r.components["outcome"] == 0.0 and "tamper" in r.flags and r.status == "fail"


@pytest.mark.parametrize("exit_call", ["import sys\nsys.exit(0)\n", "import os\nos._exit(0)\n"])
def test_exiting_early_with_status_zero_gets_zero_and_a_tamper_flag(exit_call, code_harness, scorer):
    task, good = _arith(code_harness)
    r = scorer.score(episode_request(code_harness, task, [write_solution(exit_call + good), "SUBMIT"]))
    assert r.reward <= 0.0 and {"tamper", "early_exit"} <= set(r.flags) and r.status == "fail", r.detail


def test_an_object_that_equals_everything_does_not_pass(code_harness, scorer):
    task, _ = _arith(code_harness)
    sly = "class Any:\n    def __eq__(self, other):\n        return True\n\ndef solve():\n    return Any()\n"
    r = scorer.score(episode_request(code_harness, task, [write_solution(sly), "SUBMIT"]))
    assert r.components["outcome"] == 0.0 and r.status == "fail"


# ---- infra errors (row 15) ----------------------------------------------------------------------

class Crashing:
    name, version = "answer", "crash-1"

    def __init__(self) -> None:
        self.calls = 0

    def verify(self, req):
        self.calls += 1
        raise ZeroDivisionError("verifier bug")


class Hanging:
    name, version = "answer", "hang-1"

    def __init__(self) -> None:
        self.release = threading.Event()

    def verify(self, req):
        self.release.wait(30)
        return Verdict(1.0)


def _answer_request(answer="59") -> ScoreRequest:
    task = load_tasks("terminal_like", "train", "arith")[0]
    return ScoreRequest.model_validate({"task": {"task_id": task.task_id, "harness": task.harness, "prompt": task.prompt,
                                                "answer": task.answer, "meta": task.meta},
                                       "trajectory_id": "inf", "steps": [{"action": f"ANSWER: {answer}"}],
                                       "final_answer": str(answer)})


def test_a_crashing_verifier_is_retried_then_infra_error_never_cached():
    crash = Crashing()
    s = Scorer({"answer": crash}, max_retries=2, backoff_s=0.001)
    first = s.score(_answer_request())
    assert (first.status, first.reward, first.masked, first.attempts, crash.calls) == ("infra_error", 0.0, True, 3, 3)
    assert "ZeroDivisionError" in first.detail
    s.score(_answer_request())  # not cached: tried again
    assert crash.calls == 6 and s.counters["infra_errors"] == 2


def test_a_verifier_past_its_deadline_is_infra_error_not_a_fail():
    hang = Hanging()
    s = Scorer({"answer": hang}, timeout_s=0.2, max_retries=1, backoff_s=0.001)
    try:
        r = s.score(_answer_request())
        assert (r.status, r.reward, r.attempts) == ("infra_error", 0.0, 2) and "deadline" in r.detail
    finally:
        hang.release.set()
        s.close()


def test_sandbox_unavailable_for_hidden_tests_is_infra_error(code_harness):
    task, good = _arith(code_harness)
    req = episode_request(code_harness, task, [write_solution(good), "SUBMIT"])
    broken = DirectProvider(SandboxSettings(bwrap="/nonexistent/bwrap"))
    r = Scorer(provider=broken, max_retries=1, backoff_s=0.001).score(req)
    assert r.status == "infra_error" and r.reward == 0.0 and "bwrap" in r.detail.lower()


def test_timeout_or_error_episodes_never_score_above_zero():
    s = Scorer()
    for termination in ("timeout", "error"):
        r = s.score(_answer_request().model_copy(update={"termination": termination}))
        assert r.reward <= 0.0 and r.outcome == termination


def test_a_verifier_error_is_raised_as_infra_error_not_zero():
    class NoPattern:
        name, version = "answer", "1"

        def verify(self, req):
            raise VerifierError("no pattern")
    r = Scorer({"answer": NoPattern()}, max_retries=0).score(_answer_request())
    assert r.status == "infra_error" and r.attempts == 1


# ---- null / gold (row 18) -----------------------------------------------------------------------

@pytest.mark.parametrize("name", ["terminal_like", "code_sandbox_like", "tool_api_like"])
def test_every_family_passes_its_null_and_gold_check(name, scorer):
    for family in HARNESS_FAMILIES[name]:
        task = load_tasks(name, "train", family)[0]
        assert check_task(task, scorer) == (True, "null fails, gold passes"), task.task_id


def test_a_task_whose_reference_fails_is_quarantined_and_never_scored(scorer):
    task = load_tasks("code_sandbox_like", "train", "arith")[0]
    broken = type(task)(**{**task.__dict__, "task_id": task.task_id + "-broken",
                           "meta": {**task.meta, "tests": [{"id": "value", "args": [], "expected": -12345}]}})
    assert set(quarantine_failing([task, broken], scorer)) == {broken.task_id}
    assert "reference solution fails" in scorer.quarantined[broken.task_id]
    r = scorer.score(_answer_request().model_copy(update={"task": _answer_request().task.model_copy(update={"task_id": broken.task_id})}))
    assert r.status == "infra_error" and "quarantined_task" in r.flags


# ---- service and clients (rows 19, 24) ----------------------------------------------------------

@pytest.fixture
def service(scorer):
    server = ServerThread(create_app(scorer), port=free_port(), name="reward").start()
    yield server
    server.stop()


def test_service_and_in_process_client_give_the_same_result(service, scorer):
    req = _answer_request()
    local = LocalRewardClient(scorer).score(req)
    http = HttpRewardClient(service.url)
    remote = http.score(req)
    assert remote.cached and remote.model_dump(exclude={"cached"}) == local.model_dump(exclude={"cached"})
    keyed = http.score(req.model_copy(update={"idempotency_key": local.idempotency_key}))
    assert keyed.cached and keyed.reward == local.reward
    batch = http.score_batch([req, _answer_request("0")])
    assert [b.outcome for b in batch] == ["success", "fail"]
    http.close()


@pytest.mark.parametrize("body, field", [
    ({}, "task"),
    ({"task": {"task_id": "a", "harness": "h", "prompt": "p"}, "trajectory_id": "x"}, "steps"),
    ({"task": {"task_id": "a", "harness": "h", "prompt": "p", "difficulty": "hard"}, "trajectory_id": "x", "steps": []}, "task.difficulty"),
    ({"task": {"task_id": "a", "harness": "h", "prompt": "p"}, "trajectory_id": "x", "steps": [{"action": 5}]}, "steps.0.action"),
    ({"task": {"task_id": "a", "harness": "h", "prompt": "p"}, "trajectory_id": "x", "steps": [], "reward": 1.0}, "reward"),
    ({"task": {"task_id": "a", "harness": "h", "prompt": "p"}, "trajectory_id": "x", "steps": [],
      "files": [{"path": "solution.py", "content_b64": "***"}]}, "files.0.content_b64"),
    ({"task": {"task_id": "a", "harness": "h", "prompt": "p"}, "trajectory_id": "x", "steps": [], "termination": "won"}, "termination"),
])
def test_malformed_requests_get_an_explicit_error_naming_the_field_and_no_score(service, body, field):
    r = httpx.post(service.url + "/score", json=body)
    assert r.status_code == 422
    payload = r.json()
    assert "reward" not in payload and field in [f["field"] for f in payload["fields"]], payload
    assert httpx.post(service.url + "/score", content=b"{not json", headers={"content-type": "application/json"}).status_code == 422


def test_a_wrong_idempotency_key_is_refused_and_the_client_raises_instead_of_scoring(service):
    r = httpx.post(service.url + "/score", json={**_answer_request().model_dump(mode="json"), "idempotency_key": "0" * 64})
    assert r.status_code == 409 and r.json()["fields"][0]["field"] == "idempotency_key"
    with pytest.raises(RewardRequestError, match="rejected the request \\(409\\).*idempotency_key"):
        HttpRewardClient(service.url).score(_answer_request().model_copy(update={"idempotency_key": "0" * 64}))


def test_service_down_gives_infra_error_after_bounded_retries_and_the_run_continues():
    client = HttpRewardClient(f"http://127.0.0.1:{free_port()}", timeout_s=1.0, max_retries=2, backoff_s=0.01)
    r = client.score(_answer_request())
    assert (r.status, r.reward, r.attempts) == ("infra_error", 0.0, 3) and "reward_service_unreachable" in r.flags
    assert client.counters == {"retries": 2, "unreachable": 1}


def test_service_metrics_count_statuses(service):
    HttpRewardClient(service.url).score(_answer_request("0"))
    text = httpx.get(service.url + "/metrics").text
    assert "agentrl_reward_status_fail_total 1.0" in text
