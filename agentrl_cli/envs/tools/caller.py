"""One wrapper for every tool call: the layered retry policy, per-tool circuit breakers, statistics.

Belongs here: tool exceptions, `ToolSpec`, `ToolResult`, the retry loop, the breaker. Not here:
transports (`http.py`), storing calls (`calllog.py`), building Observations (the harness does that).

What the tool reported        what the caller does
transient (connection, 5xx)   retry up to max_retries, backoff backoff_base_s * 2**n (+ <=10% jitter)
rate limited (429)            wait max(Retry-After, rate_limit_wait_s) up to max_rate_limit_waits times,
                              then the fallback tool if any, else "rate_limited"
timeout                       retried like a transient error, but only for idempotent tools
permanent                     never retried -> "error"
invalid arguments             never retried -> "invalid_action" (the model must change its call)
anything else raised          a bug in the tool -> "error"; never a crash of the caller
The breaker counts infrastructure failures (`infra_error`: transient errors given up on, timeouts,
bugs) as failures, a 429 as neither, and every other answer (empty, invalid, permanent) as a success.

The caller enforces `timeout_s` itself: fn runs on a pool worker and the caller stops waiting after it.
Python cannot kill a thread, so a hung fn keeps its worker until it returns (and interpreter exit
waits for it): give tools their own I/O timeouts (`http_tool` does). A call that timed out while
still queued for a worker is cancelled and never runs.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

from agentrl_cli.envs.tools.calllog import CallLog


class ToolError(Exception):
    """Base of the exceptions a tool implementation raises to tell the caller what happened."""


class TransientToolError(ToolError):
    """Worth retrying after a backoff: connection refused or reset, 5xx."""


class PermanentToolError(ToolError):
    """Retrying cannot help: the tool answered with a definite failure."""


class InvalidToolCall(ToolError):
    """The model's arguments are wrong; it must change the call."""


class ToolTimeout(ToolError):
    """No answer in time. Retried only for idempotent tools."""


class RateLimited(ToolError):
    """The tool asked us to slow down; `retry_after` is its Retry-After in seconds, if it gave one."""

    def __init__(self, retry_after: float | None = None, message: str = "rate limited") -> None:
        super().__init__(message)
        self.retry_after = retry_after


@dataclass(frozen=True)
class ToolSpec:
    name: str
    timeout_s: float = 10.0  # per attempt, enforced by the caller
    idempotent: bool = True  # timeouts are retried only when True (never for writes)
    max_retries: int = 2  # retries of transient errors and (idempotent) timeouts, shared budget
    backoff_base_s: float = 0.1  # exponential backoff: 0.1 s, 0.2 s, ... plus jitter <= 10%
    rate_limit_wait_s: float = 1.0  # on 429 wait max(Retry-After, this)
    max_rate_limit_waits: int = 1  # after this many waits: the fallback tool if any, else rate_limited
    fallback: str | None = None  # another registered tool, called with the same arguments when rate-limited
    breaker_threshold: int = 5  # consecutive failed calls (after retries) that open the circuit
    breaker_reset_s: float = 30.0  # open -> half-open after this; one trial call closes or re-opens it
    max_rate_limit_wait_s: float = 30.0  # a longer Retry-After is not waited out (fallback / rate_limited at once)

    def __post_init__(self) -> None:
        for key in ("timeout_s", "breaker_threshold", "breaker_reset_s", "max_retries", "backoff_base_s",
                    "rate_limit_wait_s", "max_rate_limit_waits", "max_rate_limit_wait_s"):
            value, strict = getattr(self, key), key in ("timeout_s", "breaker_threshold", "breaker_reset_s")
            if not (value > 0 if strict else value >= 0):
                raise ValueError(f"ToolSpec({self.name!r}).{key} must be {'>' if strict else '>='} 0, got {value!r}")
        if not self.name or self.fallback == self.name:
            raise ValueError(f"ToolSpec needs a non-empty name and a fallback other than itself, got "
                             f"name={self.name!r} fallback={self.fallback!r}")


@dataclass
class ToolResult:
    tool: str  # the tool that produced the result (the fallback's name if one was used)
    status: str  # "ok" | "empty" | "error" | "timeout" | "rate_limited" | "invalid_action"
    output: Any = None
    error: str | None = None  # message for the model when status is not ok/empty
    latency_ms: float = 0.0  # total, including retries and waits
    retries: int = 0  # attempts beyond the first of each tool (transient, timeout and rate-limit retries)
    attempts: list[dict] = field(default_factory=list)  # {"tool", "status", "latency_ms", "error", "wait_s"}
    infra_error: bool = False  # the tool infrastructure failed (not the model): mask, do not score


def is_empty(output: Any) -> bool:
    """True for None, "", [], {} and a dict whose "results"/"result" value is one of those."""
    if output is None or (isinstance(output, (str, list, tuple, dict)) and len(output) == 0):
        return True
    if isinstance(output, dict):
        for key in ("results", "result"):
            if key in output:
                value = output[key]
                return value is None or (isinstance(value, (str, list, tuple, dict)) and len(value) == 0)
    return False


def backoff_delay(base_s: float, retry_index: int, rng: random.Random) -> float:
    """Wait before retry number retry_index (0-based): base * 2**index, plus up to 10% jitter."""
    delay = base_s * (2 ** retry_index)
    return delay * (1.0 + 0.1 * rng.random())


class CircuitBreaker:
    """closed -> open after `threshold` consecutive failed calls; open -> half_open after `reset_s`;
    half_open lets one trial call through: success closes the circuit, failure re-opens it."""

    def __init__(self, threshold: int, reset_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.threshold, self.reset_s, self._clock = threshold, reset_s, clock
        self._lock = threading.Lock()
        self._failures = 0
        self._opened_at: float | None = None
        self._trial_in_flight = False

    def _state(self) -> str:
        if self._opened_at is None:
            return "closed"
        return "half_open" if self._clock() - self._opened_at >= self.reset_s else "open"

    def state(self) -> str:
        with self._lock:
            return self._state()

    def acquire(self) -> tuple[str | None, float]:
        """("call" | "trial", 0) when a call may go ahead, else (None, seconds until it may)."""
        with self._lock:
            state = self._state()
            if state == "closed":
                return "call", 0.0
            if state == "half_open" and not self._trial_in_flight:
                self._trial_in_flight = True
                return "trial", 0.0
            return None, max(0.0, self._opened_at + self.reset_s - self._clock())

    def record(self, outcome: str, trial: bool = False) -> None:
        """outcome: "success", "failure" or "neutral" (neither, e.g. rate limited)."""
        with self._lock:
            if trial:
                self._trial_in_flight = False
            if outcome == "success":
                self._failures, self._opened_at = 0, None
            elif outcome == "failure":
                self._failures += 1
                if trial or (self._opened_at is None and self._failures >= self.threshold):
                    self._opened_at = self._clock()


_FINAL_STATUS = {"transient_error": "error", "unexpected_error": "error"}
_INFRA = {"transient_error", "unexpected_error", "timeout", "rate_limited"}


class ToolCaller:
    """Registered tools behind one `call`. Thread-safe; share one per process (or per harness)."""

    def __init__(self, log: CallLog | None = None, *, max_workers: int = 32,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 rng: random.Random | None = None) -> None:
        self.log = log if log is not None else CallLog()
        self._clock, self._sleep = clock, sleep
        self._rng = rng or random.Random()
        self._lock = threading.Lock()  # guards _rng and _stats
        self._tools: dict[str, tuple[ToolSpec, Callable[[dict], Any]]] = {}
        self._breakers: dict[str, CircuitBreaker] = {}
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="tool-call")
        self._stats: dict[str, dict] = {}

    def register(self, spec: ToolSpec, fn: Callable[[dict], Any]) -> None:
        self._tools[spec.name] = (spec, fn)
        self._breakers[spec.name] = CircuitBreaker(spec.breaker_threshold, spec.breaker_reset_s, self._clock)

    def breaker_state(self, name: str) -> str:
        return self._breakers[name].state()

    def close(self) -> None:
        """Stop accepting calls; workers still running a hung tool are left to finish on their own."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def call(self, name: str, arguments: dict, *, run_id: str = "", episode_id: str = "", step: int = 0) -> ToolResult:
        start = self._clock()
        if name not in self._tools:
            known = ", ".join(sorted(self._tools)) or "none"
            result = ToolResult(name, "invalid_action", error=f"unknown tool {name!r}; known tools: {known}")
        elif not isinstance(arguments, dict):
            result = ToolResult(name, "invalid_action",
                                error=f"arguments to {name} must be a JSON object, got {type(arguments).__name__}")
        else:
            result = self._call_with_breaker(name, arguments, allow_fallback=True)
        result.latency_ms = round((self._clock() - start) * 1000.0, 3)
        self._count(name if name in self._tools else "<unknown tool>", result, fallback_used=result.tool != name)
        self.log.record({"run_id": run_id, "episode_id": episode_id, "step": step, "requested_tool": name,
                         "arguments": arguments, **vars(result)})
        return result

    def _call_with_breaker(self, name: str, arguments: dict, allow_fallback: bool) -> ToolResult:
        (spec, fn), breaker = self._tools[name], self._breakers[name]
        permit, wait = breaker.acquire()
        if permit is None:
            return ToolResult(name, "error", error=f"circuit open for {name}; retry after {wait:.1f} s",
                              infra_error=True)
        result = self._attempts(spec, fn, arguments)
        outcome = "neutral" if result.status == "rate_limited" else "failure" if result.infra_error else "success"
        breaker.record(outcome, trial=permit == "trial")
        if result.status == "rate_limited" and allow_fallback and spec.fallback:
            if spec.fallback not in self._tools:
                result.error = f"{result.error}; fallback tool {spec.fallback!r} is not registered"
                return result
            used = self._call_with_breaker(spec.fallback, arguments, allow_fallback=False)
            used.attempts = result.attempts + used.attempts
            used.retries += result.retries
            return used
        return result

    def _attempts(self, spec: ToolSpec, fn: Callable[[dict], Any], arguments: dict) -> ToolResult:
        attempts: list[dict] = []
        retries_left, backoffs, rate_waits = spec.max_retries, 0, 0
        while True:
            started = self._clock()
            kind, output, message, retry_after = self._attempt_once(spec, fn, arguments)
            retry, wait = False, 0.0
            if kind == "rate_limited":
                wait = max(retry_after or 0.0, spec.rate_limit_wait_s)
                retry = rate_waits < spec.max_rate_limit_waits and wait <= spec.max_rate_limit_wait_s
                message = f"rate limited by {spec.name}; retry after {wait:.1f} s"
                rate_waits += retry
            elif (kind == "transient_error" or (kind == "timeout" and spec.idempotent)) and retries_left > 0:
                with self._lock:
                    wait = backoff_delay(spec.backoff_base_s, backoffs, self._rng)
                retry, backoffs, retries_left = True, backoffs + 1, retries_left - 1
            attempts.append({"tool": spec.name, "status": kind, "error": message,
                             "latency_ms": round((self._clock() - started) * 1000.0, 3),
                             "wait_s": round(wait, 6) if retry else 0.0})
            if not retry:
                break
            self._sleep(wait)
        if kind == "transient_error" and len(attempts) > 1:
            message = f"{spec.name} failed after {len(attempts)} attempts: {message}"
        return ToolResult(spec.name, _FINAL_STATUS.get(kind, kind), output=output, error=message,
                          retries=len(attempts) - 1, attempts=attempts, infra_error=kind in _INFRA)

    def _attempt_once(self, spec: ToolSpec, fn: Callable[[dict], Any], arguments: dict):
        """(kind, output, error message, retry_after) of one attempt; never raises."""
        try:
            output = self._run_with_deadline(spec, fn, arguments)
        except InvalidToolCall as exc:
            return "invalid_action", None, f"invalid arguments for {spec.name}: {exc}", None
        except RateLimited as exc:
            return "rate_limited", None, str(exc), exc.retry_after
        except (ToolTimeout, TimeoutError) as exc:
            return "timeout", None, str(exc) or f"{spec.name} timed out", None
        except TransientToolError as exc:
            return "transient_error", None, str(exc) or type(exc).__name__, None
        except PermanentToolError as exc:
            return "error", None, str(exc) or f"{spec.name} failed", None
        except Exception as exc:  # noqa: BLE001 - a bug in the tool must not take the rollout down
            return "unexpected_error", None, f"unexpected {type(exc).__name__} in tool {spec.name}: {exc}", None
        return ("empty" if is_empty(output) else "ok"), output, None, None

    def _run_with_deadline(self, spec: ToolSpec, fn: Callable[[dict], Any], arguments: dict) -> Any:
        future = self._pool.submit(fn, dict(arguments))
        try:
            return future.result(timeout=spec.timeout_s)
        except TimeoutError:
            if future.done():  # finished just now, or the tool raised a TimeoutError of its own
                return future.result()
            note = " (it was still queued for a free worker and was not started)" if future.cancel() else ""
            raise ToolTimeout(f"{spec.name} did not answer within {spec.timeout_s:g} s{note}") from None

    def _count(self, key: str, result: ToolResult, fallback_used: bool) -> None:
        with self._lock:
            tool = self._stats.setdefault(key, {"calls": 0, "by_status": Counter(), "retries": 0, "fallbacks": 0})
            tool["calls"] += 1
            tool["by_status"][result.status] += 1
            tool["retries"] += result.retries
            tool["fallbacks"] += fallback_used

    def stats(self) -> dict:
        """{"calls", "by_status", "retries", "tools": {name: {..., "breaker"}}} since this caller started."""
        with self._lock:
            tools = {name: {**s, "by_status": dict(s["by_status"])} for name, s in self._stats.items()}
        for name, tool in tools.items():
            tool["breaker"] = self._breakers[name].state() if name in self._breakers else "n/a"
        by_status = sum((Counter(t["by_status"]) for t in tools.values()), Counter())
        return {"calls": sum(t["calls"] for t in tools.values()), "by_status": dict(by_status),
                "retries": sum(t["retries"] for t in tools.values()), "tools": tools}
