"""The tool caller's pure pieces, with local tool functions and injected clocks: no server."""

from __future__ import annotations

import json
import random
import threading

import httpx
import pytest

from agentrl_cli.envs.tools import (CallLog, CircuitBreaker, InvalidToolCall, PermanentToolError, RateLimited,
                               ToolCaller, ToolSpec, ToolTimeout, TransientToolError, backoff_delay, http_tool,
                               is_empty)
from harnesses.tool_service import CalculatorError, ToolService, evaluate


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds

    waits: list[float]


@pytest.fixture
def clock():
    c = FakeClock()
    c.waits = []
    return c


@pytest.fixture
def make_caller(clock):
    made: list[ToolCaller] = []

    def make(*tools, **kwargs) -> ToolCaller:
        caller = ToolCaller(clock=clock, sleep=clock.sleep, rng=random.Random(0), **kwargs)
        for spec, fn in tools:
            caller.register(spec, fn)
        made.append(caller)
        return caller

    yield make
    for caller in made:
        caller.close()


def failing(*errors, then=None):
    """A tool that raises each error in turn, then returns `then`; .calls counts invocations."""
    queue = list(errors)

    def fn(arguments):
        fn.calls += 1
        if queue:
            raise queue.pop(0)
        return then
    fn.calls = 0
    return fn


@pytest.mark.parametrize("output", [None, "", [], {}, {"results": []}, {"result": ""}, {"result": None},
                                    {"results": {}}])
def test_empty_outputs_are_detected(output):
    assert is_empty(output)


@pytest.mark.parametrize("output", [0, False, "0", [0], {"results": [None]}, {"result": 0}, {"answer": []}])
def test_falsy_but_real_outputs_are_not_empty(output):
    assert not is_empty(output)


def test_backoff_doubles_from_the_base_with_at_most_ten_percent_jitter():
    rng = random.Random(7)
    delays = [backoff_delay(0.1, i, rng) for i in range(4)]
    for i, delay in enumerate(delays):
        assert 0.1 * 2 ** i <= delay <= 0.1 * 2 ** i * 1.1
    assert delays == sorted(delays)


def test_breaker_opens_after_threshold_consecutive_failures_only(clock):
    breaker = CircuitBreaker(threshold=3, reset_s=30.0, clock=clock)
    for outcome in ("failure", "failure", "success", "failure", "failure", "neutral"):
        breaker.record(outcome)
    assert breaker.state() == "closed"
    breaker.record("failure")
    assert breaker.state() == "open" and breaker.acquire() == (None, 30.0)


def test_breaker_half_opens_after_reset_admits_one_trial_and_closes_on_success(clock):
    breaker = CircuitBreaker(threshold=1, reset_s=30.0, clock=clock)
    breaker.record("failure")
    clock.now += 29.9
    assert breaker.state() == "open"
    clock.now += 0.1
    assert breaker.state() == "half_open"
    assert breaker.acquire() == ("trial", 0.0)
    assert breaker.acquire()[0] is None  # a second caller waits while the trial is in flight
    breaker.record("success", trial=True)
    assert breaker.state() == "closed" and breaker.acquire() == ("call", 0.0)


def test_breaker_trial_failure_reopens_with_a_fresh_timer(clock):
    breaker = CircuitBreaker(threshold=1, reset_s=10.0, clock=clock)
    breaker.record("failure")
    clock.now += 10.0
    assert breaker.acquire()[0] == "trial"
    breaker.record("failure", trial=True)
    assert breaker.state() == "open" and breaker.acquire() == (None, 10.0)


def test_transient_errors_back_off_exponentially_then_succeed(make_caller, clock):
    tool = failing(TransientToolError("reset"), TransientToolError("reset"), then={"result": 3})
    caller = make_caller((ToolSpec("t", max_retries=2), tool))
    result = caller.call("t", {})
    assert (result.status, result.output, result.retries, tool.calls) == ("ok", {"result": 3}, 2, 3)
    assert 0.1 <= clock.waits[0] <= 0.11 and 0.2 <= clock.waits[1] <= 0.22
    assert result.latency_ms == pytest.approx(sum(clock.waits) * 1000, abs=0.01)  # waits count in latency


def test_permanent_and_invalid_errors_are_never_retried(make_caller, clock):
    permanent, invalid = failing(PermanentToolError("gone")), failing(InvalidToolCall("key missing"))
    caller = make_caller((ToolSpec("p"), permanent), (ToolSpec("i"), invalid))
    assert (caller.call("p", {}).status, caller.call("i", {}).status) == ("error", "invalid_action")
    assert permanent.calls == invalid.calls == 1 and clock.waits == []


def test_an_unexpected_exception_is_an_error_not_a_crash(make_caller):
    caller = make_caller((ToolSpec("buggy"), failing(KeyError("oops"))))
    result = caller.call("buggy", {})
    assert result.status == "error" and "unexpected KeyError" in result.error and len(result.attempts) == 1


def test_unknown_tool_and_non_object_arguments_are_invalid_actions(make_caller):
    caller = make_caller((ToolSpec("search"), lambda a: "x"), (ToolSpec("calc"), lambda a: 1))
    unknown = caller.call("serach", {})
    assert unknown.status == "invalid_action" and "known tools: calc, search" in unknown.error
    assert caller.call("calc", ["1+1"]).status == "invalid_action"
    assert caller.stats()["tools"]["<unknown tool>"]["calls"] == 1  # made-up names do not grow the stats


def test_the_caller_enforces_timeout_and_never_retries_a_non_idempotent_tool(make_caller):
    release = threading.Event()
    calls = []

    def hangs(arguments):
        calls.append(1)
        release.wait(5)

    caller = make_caller((ToolSpec("write", timeout_s=0.05, idempotent=False, max_retries=3), hangs))
    try:
        result = caller.call("write", {})
        assert result.status == "timeout" and len(calls) == 1 and len(result.attempts) == 1
    finally:
        release.set()


def test_a_call_that_times_out_while_queued_never_runs(make_caller):
    release, ran = threading.Event(), []
    caller = make_caller((ToolSpec("slow", timeout_s=0.05, max_retries=0), lambda a: release.wait(5)),
                         (ToolSpec("write", timeout_s=0.05, idempotent=False), lambda a: ran.append(a)),
                         max_workers=1)
    try:
        assert caller.call("slow", {}).status == "timeout"  # holds the only worker
        result = caller.call("write", {"x": 1})
        assert result.status == "timeout" and "not started" in result.error
    finally:
        release.set()
    caller.close()
    assert ran == []


def test_retry_after_beyond_the_cap_is_not_waited(make_caller, clock):
    caller = make_caller((ToolSpec("api", max_rate_limit_wait_s=5.0), failing(RateLimited(3600.0))))
    result = caller.call("api", {})
    assert result.status == "rate_limited" and clock.waits == [] and len(result.attempts) == 1


def test_circuit_open_short_circuits_without_calling_the_tool(make_caller, clock):
    tool = failing(*[TransientToolError("down")] * 2, then={"results": [1]})
    caller = make_caller((ToolSpec("api", max_retries=0, breaker_threshold=2, breaker_reset_s=30.0), tool))
    caller.call("api", {}), caller.call("api", {})
    blocked = caller.call("api", {})
    assert blocked.error == "circuit open for api; retry after 30.0 s" and tool.calls == 2
    clock.now += 30.0
    assert caller.breaker_state("api") == "half_open"
    assert caller.call("api", {}).status == "ok" and caller.breaker_state("api") == "closed"


def test_empty_results_and_invalid_calls_count_as_success_for_the_breaker(make_caller):
    tool = failing(TransientToolError("a"), InvalidToolCall("b"), TransientToolError("c"),
                   TransientToolError("d"), then=[])
    caller = make_caller((ToolSpec("api", max_retries=0, breaker_threshold=2), tool))
    statuses = [caller.call("api", {}).status for _ in range(5)]
    assert statuses == ["error", "invalid_action", "error", "error", "error"]
    assert caller.breaker_state("api") == "open"  # only the last two failures were consecutive
    fresh = make_caller((ToolSpec("api", max_retries=0, breaker_threshold=2),
                         failing(TransientToolError("a"), then=None)))
    assert [fresh.call("api", {}).status for _ in range(3)] == ["error", "empty", "empty"]
    assert fresh.breaker_state("api") == "closed"


def test_stats_count_calls_statuses_and_retries_per_tool(make_caller):
    caller = make_caller((ToolSpec("a", max_retries=1), failing(TransientToolError("x"), then=5)),
                         (ToolSpec("b"), lambda args: None))
    caller.call("a", {}), caller.call("b", {}), caller.call("b", {})
    stats = caller.stats()
    assert stats["calls"] == 3 and stats["retries"] == 1 and stats["by_status"] == {"ok": 1, "empty": 2}
    assert stats["tools"]["a"]["breaker"] == "closed" and stats["tools"]["b"]["calls"] == 2


def test_tool_spec_rejects_bad_values_naming_the_field():
    with pytest.raises(ValueError, match=r"timeout_s must be > 0"):
        ToolSpec("x", timeout_s=0)
    with pytest.raises(ValueError, match="fallback other than itself"):
        ToolSpec("x", fallback="x")


def test_call_log_truncates_long_outputs_and_keeps_unserialisable_values(tmp_path):
    with CallLog(tmp_path / "log.jsonl") as log:
        stored = log.record({"run_id": "r", "tool": "t", "arguments": {"obj": object()}, "output": "x" * 10_000})
    assert stored["output_truncated"] and len(stored["output"].encode()) == 4096
    assert stored["arguments"]["obj"].startswith("<object object")
    line = json.loads((tmp_path / "log.jsonl").read_text())
    assert line["requested_tool"] == "t" and line["status"] is None


def test_call_log_is_thread_safe_and_indexed(tmp_path):
    log = CallLog(tmp_path / "log.jsonl")

    def writer(n: int) -> None:
        for step in range(100):
            log.record({"run_id": "r", "episode_id": f"ep{n}", "step": step, "tool": "t", "status": "ok"})

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log.close()
    assert len(log) == 800 and len(log.query(run_id="r")) == 800 and len(log.query(step=7)) == 8
    assert [e["step"] for e in log.query(episode_id="ep3")] == list(range(100))
    assert len((tmp_path / "log.jsonl").read_text().splitlines()) == 800


def test_call_log_drops_the_oldest_half_past_max_entries():
    log = CallLog(max_entries=10)
    assert log, "an empty log is truthy, so `log or CallLog()` keeps it"
    for step in range(11):
        log.record({"episode_id": "e", "step": step, "tool": "t"})
    assert [e["step"] for e in log.query(episode_id="e")] == [5, 6, 7, 8, 9, 10]


def _mock_tool(handler):
    return http_tool("http://127.0.0.1:9/tool", client=httpx.Client(transport=httpx.MockTransport(handler)))


@pytest.mark.parametrize("response,error", [
    (httpx.Response(503, json={"detail": "down"}), TransientToolError),
    (httpx.Response(422, json={"detail": "bad"}), InvalidToolCall),
    (httpx.Response(400, text="bad"), InvalidToolCall),
    (httpx.Response(404, json={"detail": "unknown table"}), PermanentToolError),
    (httpx.Response(200, text="not json"), PermanentToolError),
])
def test_http_status_codes_map_to_tool_errors(response, error):
    with pytest.raises(error):
        _mock_tool(lambda request: response)({"q": 1})


def test_http_429_carries_retry_after_and_2xx_returns_json():
    with pytest.raises(RateLimited) as info:
        _mock_tool(lambda r: httpx.Response(429, headers={"Retry-After": "2"}))({})
    assert info.value.retry_after == 2.0
    echo = _mock_tool(lambda r: httpx.Response(200, json={"echo": json.loads(r.content)}))
    assert echo({"a": 1}) == {"echo": {"a": 1}}


@pytest.mark.parametrize("exc,error", [
    (httpx.ConnectError("refused"), TransientToolError), (httpx.ConnectTimeout("slow"), TransientToolError),
    (httpx.ReadTimeout("slow"), ToolTimeout), (httpx.RemoteProtocolError("eof"), TransientToolError),
])
def test_http_transport_errors_map_to_tool_errors(exc, error):
    def raise_(request):
        raise exc
    with pytest.raises(error):
        _mock_tool(raise_)({})


@pytest.mark.parametrize("expression,value", [("1 + 2 * 3", 7), ("(1 + 2) * 3", 9), ("7 // 2 % 3", 0),
                                              ("2 ** -1", 0.5), ("-3 ** 2", -9), ("1.5e3 / 3", 500.0)])
def test_calculator_evaluates_arithmetic(expression, value):
    assert evaluate(expression) == value


@pytest.mark.parametrize("expression", ["__import__('os')", "2**10**10", "a", "print(1)", "[1]", "1 if 1 else 2",
                                        "1 < 2", "(-8) ** 0.5", "1e999 - 1e999", "2.0 ** 5000", "1 % 0", "lambda: 1"])
def test_calculator_refuses_everything_but_finite_arithmetic(expression):
    with pytest.raises(CalculatorError):
        evaluate(expression)


@pytest.mark.parametrize("host", ["0.0.0.0", "10.0.0.1", "example.com", "::"])
def test_tool_service_refuses_non_loopback_hosts(host):
    with pytest.raises(ValueError, match="not a loopback address"):
        ToolService({}, host=host)
