"""The tool caller against a real tool service on 127.0.0.1 with injected faults (docs/security.md rows 15, 24)."""

from __future__ import annotations

import time

import httpx
import pytest

from agentrl_cli.envs.tools import CallLog, ToolCaller, ToolSpec, http_tool
from harnesses.tool_service import Faults, ToolService

pytestmark = pytest.mark.integration

TABLES = {"capitals": {"france": "Paris", "japan": "Tokyo", "peru": "Lima"}}


def _wait(predicate, seconds: float) -> bool:
    """Poll predicate until it is true or `seconds` pass; True if it became true."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


@pytest.fixture(scope="module")
def service():
    with ToolService(TABLES) as svc:
        yield svc


@pytest.fixture
def svc(service):
    service.set_faults(Faults())
    yield service
    service.set_faults(Faults())


@pytest.fixture
def http_tools(svc):
    made = []

    def make(endpoint: str, timeout_s: float = 2.0):
        made.append(http_tool(f"{svc.url}/tools/{endpoint}", timeout_s=timeout_s))
        return made[-1]

    yield make
    for tool in made:
        tool.close()


@pytest.fixture
def make_caller(http_tools):
    made: list[ToolCaller] = []

    def make(*specs: ToolSpec, sleep=time.sleep, log: CallLog | None = None, **local_tools) -> ToolCaller:
        """Each spec calls the service endpoint /tools/<spec.name>; local_tools are (spec, fn) pairs."""
        caller = ToolCaller(log, sleep=sleep)
        for spec in specs:
            caller.register(spec, http_tools(spec.name, spec.timeout_s))
        for spec, fn in local_tools.values():
            caller.register(spec, fn)
        made.append(caller)
        return caller

    yield make
    for caller in made:
        caller.close()


def requests_to(svc, endpoint: str) -> int:
    return svc.stats()["requests"].get(endpoint, 0)


class RecordingSleep:
    """Records the caller's waits and returns at once (the service's clock keeps running)."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


def test_calculator_answers_through_the_caller(make_caller):
    caller = make_caller(ToolSpec("calculator"))
    result = caller.call("calculator", {"expression": "(1 + 2) * 3 - 4 / 2"})
    assert (result.status, result.output, result.retries, len(result.attempts)) == ("ok", {"result": 7.0}, 0, 1)


def test_transient_5xx_is_retried_with_growing_backoff_then_reported_as_error(make_caller, svc):
    svc.set_faults(Faults(failure_rate=1.0))
    caller = make_caller(ToolSpec("calculator", max_retries=2, backoff_base_s=0.1))
    before = requests_to(svc, "/tools/calculator")
    result = caller.call("calculator", {"expression": "1+1"})
    assert result.status == "error" and result.infra_error and result.output is None
    assert [a["status"] for a in result.attempts] == ["transient_error"] * 3
    assert result.retries == 2 and "503" in result.error and "after 3 attempts" in result.error
    first, second, last = (a["wait_s"] for a in result.attempts)
    assert 0.1 <= first <= 0.11 and 0.2 <= second <= 0.22 and second > first and last == 0.0
    assert requests_to(svc, "/tools/calculator") - before == 3


def test_transient_5xx_then_success_after_one_retry(make_caller, http_tools, svc):
    svc.set_faults(Faults(failure_rate=1.0))
    base = http_tools("calculator")

    def recovers_after_first_failure(arguments):
        try:
            return base(arguments)
        finally:
            svc.set_faults(Faults())

    caller = make_caller(calc=(ToolSpec("calculator", max_retries=2), recovers_after_first_failure))
    result = caller.call("calculator", {"expression": "6*7"})
    assert result.status == "ok" and result.output == {"result": 42}
    assert [a["status"] for a in result.attempts] == ["transient_error", "ok"] and result.retries == 1


def test_rate_limit_is_waited_out_then_the_call_succeeds(make_caller, svc):
    svc.set_faults(Faults(rate_limit_per_s=1.0))
    assert httpx.post(f"{svc.url}/tools/list_keys", json={"table": "capitals"}).status_code == 200  # drains the bucket
    caller = make_caller(ToolSpec("lookup", rate_limit_wait_s=0.2))
    result = caller.call("lookup", {"table": "capitals", "key": "peru"})
    assert result.status == "ok" and result.output == {"results": ["Lima"]}
    assert [a["status"] for a in result.attempts] == ["rate_limited", "ok"]
    assert result.attempts[0]["wait_s"] == 1.0  # Retry-After (1 s) beats rate_limit_wait_s (0.2 s)
    assert result.attempts[0]["wait_s"] > ToolSpec("lookup").backoff_base_s


def test_rate_limit_after_waiting_goes_to_the_fallback_tool(make_caller, svc):
    svc.set_faults(Faults(rate_limit_per_s=0.05))  # one token per 20 s: Retry-After is 20
    httpx.post(f"{svc.url}/tools/list_keys", json={"table": "capitals"})
    sleep = RecordingSleep()
    cache = {"japan": "Tokyo"}
    caller = make_caller(ToolSpec("lookup", rate_limit_wait_s=0.5, fallback="lookup_cache"), sleep=sleep,
                         cache=(ToolSpec("lookup_cache"), lambda args: {"results": [cache[args["key"]]]}))
    result = caller.call("lookup", {"table": "capitals", "key": "japan"}, run_id="r1")
    assert result.tool == "lookup_cache" and result.status == "ok" and result.output == {"results": ["Tokyo"]}
    assert [(a["tool"], a["status"]) for a in result.attempts] == [
        ("lookup", "rate_limited"), ("lookup", "rate_limited"), ("lookup_cache", "ok")]
    assert sleep.waits == [20.0]
    (entry,) = caller.log.query(run_id="r1")
    assert (entry["tool"], entry["requested_tool"]) == ("lookup_cache", "lookup")
    assert caller.stats()["tools"]["lookup"]["fallbacks"] == 1


def test_rate_limit_without_fallback_is_reported_as_rate_limited(make_caller, svc):
    svc.set_faults(Faults(rate_limit_per_s=0.05))
    httpx.post(f"{svc.url}/tools/list_keys", json={"table": "capitals"})
    sleep = RecordingSleep()
    caller = make_caller(ToolSpec("lookup", rate_limit_wait_s=25.0), sleep=sleep)
    result = caller.call("lookup", {"table": "capitals", "key": "japan"})
    assert result.status == "rate_limited" and result.tool == "lookup" and result.infra_error
    assert sleep.waits == [25.0]  # rate_limit_wait_s (25 s) beats Retry-After (20 s)
    assert len(result.attempts) == 2 and "retry after" in result.error
    assert caller.breaker_state("lookup") == "closed"  # being throttled is not a failure of the tool


def test_unknown_table_is_a_permanent_error_and_not_retried(make_caller, svc):
    caller = make_caller(ToolSpec("lookup", max_retries=2))
    before = requests_to(svc, "/tools/lookup")
    result = caller.call("lookup", {"table": "planets", "key": "mars"})
    assert result.status == "error" and len(result.attempts) == 1 and result.retries == 0
    assert "404" in result.error and "unknown table" in result.error and not result.infra_error
    assert requests_to(svc, "/tools/lookup") - before == 1


def test_bad_expression_is_an_invalid_action_and_not_retried(make_caller):
    caller = make_caller(ToolSpec("calculator", max_retries=2))
    result = caller.call("calculator", {"expression": "2 +* 3"})
    assert result.status == "invalid_action" and len(result.attempts) == 1
    assert "not an arithmetic expression" in result.error


def test_timeouts_are_retried_for_an_idempotent_tool(make_caller, svc):
    svc.set_faults(Faults(hang_rate=1.0))
    caller = make_caller(ToolSpec("lookup", timeout_s=0.3, max_retries=1))
    result = caller.call("lookup", {"table": "capitals", "key": "peru"})
    assert result.status == "timeout" and result.output is None and result.infra_error
    assert [a["status"] for a in result.attempts] == ["timeout", "timeout"] and result.retries == 1


def test_timeouts_are_never_retried_for_a_non_idempotent_tool(make_caller, svc):
    svc.set_faults(Faults(hang_rate=1.0))
    caller = make_caller(ToolSpec("calculator", timeout_s=0.3, idempotent=False, max_retries=2))
    result = caller.call("calculator", {"expression": "1"})
    assert result.status == "timeout" and len(result.attempts) == 1 and result.retries == 0


def test_missing_key_is_empty_not_error(make_caller):
    caller = make_caller(ToolSpec("lookup"))
    result = caller.call("lookup", {"table": "capitals", "key": "atlantis"})
    assert (result.status, result.output, result.error) == ("empty", {"results": []}, None)


def test_a_failure_is_never_reported_as_empty(make_caller, svc):
    svc.set_faults(Faults(failure_rate=1.0))
    caller = make_caller(ToolSpec("lookup", max_retries=0))
    result = caller.call("lookup", {"table": "capitals", "key": "atlantis"})
    assert result.status == "error" and result.output is None


def test_circuit_breaker_opens_short_circuits_half_opens_and_closes(make_caller, svc):
    svc.set_faults(Faults(failure_rate=1.0))
    caller = make_caller(ToolSpec("calculator", max_retries=0, breaker_threshold=3, breaker_reset_s=0.2))
    for _ in range(3):
        assert caller.call("calculator", {"expression": "1"}).status == "error"
    assert caller.breaker_state("calculator") == "open"
    before = requests_to(svc, "/tools/calculator")
    blocked = caller.call("calculator", {"expression": "1"})
    assert blocked.status == "error" and blocked.attempts == [] and blocked.infra_error
    assert blocked.error.startswith("circuit open for calculator; retry after")
    assert requests_to(svc, "/tools/calculator") == before  # the service was not called
    assert _wait(lambda: caller.breaker_state("calculator") == "half_open", 2.0)
    svc.set_faults(Faults())
    assert caller.call("calculator", {"expression": "2+2"}).output == {"result": 4}
    assert caller.breaker_state("calculator") == "closed"
    assert requests_to(svc, "/tools/calculator") == before + 1


def test_half_open_trial_failure_reopens_the_circuit(make_caller, svc):
    svc.set_faults(Faults(failure_rate=1.0))
    caller = make_caller(ToolSpec("calculator", max_retries=0, breaker_threshold=1, breaker_reset_s=0.2))
    caller.call("calculator", {"expression": "1"})
    assert _wait(lambda: caller.breaker_state("calculator") == "half_open", 2.0)
    assert caller.call("calculator", {"expression": "1"}).attempts[0]["status"] == "transient_error"
    assert caller.breaker_state("calculator") == "open"


def test_call_log_holds_inputs_outputs_latency_and_retries_by_run_episode_step(make_caller, svc, tmp_path):
    log = CallLog(tmp_path / "calls.jsonl")
    caller = make_caller(ToolSpec("calculator"), ToolSpec("lookup"), log=log)
    caller.call("calculator", {"expression": "2**8"}, run_id="run-a", episode_id="ep-1", step=0)
    caller.call("lookup", {"table": "capitals", "key": "france"}, run_id="run-a", episode_id="ep-1", step=1)
    caller.call("lookup", {"table": "capitals", "key": "nowhere"}, run_id="run-a", episode_id="ep-2", step=1)
    caller.call("calculator", {"expression": "1/0"}, run_id="run-b", episode_id="ep-3", step=0)
    (entry,) = log.query(episode_id="ep-1", step=1)
    assert entry["arguments"] == {"table": "capitals", "key": "france"} and entry["output"] == {"results": ["Paris"]}
    assert entry["status"] == "ok" and entry["retries"] == 0 and entry["latency_ms"] > 0
    assert entry["run_id"] == "run-a" and entry["timestamp"].endswith("+00:00") and len(entry["attempts"]) == 1
    assert [e["status"] for e in log.query(run_id="run-a")] == ["ok", "ok", "empty"]
    assert [e["episode_id"] for e in log.query(run_id="run-a", step=1)] == ["ep-1", "ep-2"]
    (invalid,) = log.query(tool="calculator", run_id="run-b")
    assert invalid["error"] == "invalid arguments for calculator: division by zero"
    log.close()
    assert len((tmp_path / "calls.jsonl").read_text().splitlines()) == 4


@pytest.mark.parametrize("expression,reason", [
    ("__import__('os')", "function call"), ("2**10**10", "exponent"), ("x + 1", "name 'x'"),
    ("abs(-1)", "function call"), ("(1).real", "attribute"), ("1/0", "division by zero"),
    ("10**4000 * 10**4000", "too large"), ("1" * 501, "longer than 500"), ("True + 1", "constant"),
])
def test_calculator_refuses_code_names_calls_and_huge_powers(svc, expression, reason):
    response = httpx.post(f"{svc.url}/tools/calculator", json={"expression": expression})
    assert response.status_code == 422 and reason in response.json()["detail"]


def test_list_keys_admin_faults_and_health_is_never_faulted(svc):
    keys = httpx.post(f"{svc.url}/tools/list_keys", json={"table": "capitals"}).json()
    assert keys == {"results": ["france", "japan", "peru"]}
    assert httpx.post(f"{svc.url}/admin/faults", json={"failure_rate": 1.0, "seed": 3}).status_code == 200
    assert httpx.get(f"{svc.url}/admin/faults").json()["failure_rate"] == 1.0
    assert httpx.get(f"{svc.url}/health").json() == {"status": "ok"}
    assert httpx.post(f"{svc.url}/tools/list_keys", json={"table": "capitals"}).status_code == 503
    assert httpx.get(f"{svc.url}/admin/stats").json()["faults"]["failure"] >= 1
    assert httpx.post(f"{svc.url}/admin/faults", json={"failure_rate": 2}).status_code == 422
