"""A calculator / lookup tool API with injectable latency, failures, hangs and rate limits, for loopback.

Belongs here: the FastAPI app (`create_app`), its fault injection (`Faults`), the safe arithmetic
evaluator, and `ToolService`, which runs the app on a loopback port in a background thread. Not
here: retry policy (`agentrl_cli.envs.tools.caller`). Faults apply to /tools/* only, never to /health or
/admin/*; they are drawn from random.Random(seed), reseeded whenever the faults are replaced.
"""

from __future__ import annotations

import ast
import asyncio
import math
import operator
import random
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

from agentrl_cli.core.serving import ServerThread

MAX_EXPRESSION_CHARS = 500
MAX_EXPONENT = 10_000
MAX_INT_BITS = 14_000  # keeps integer results printable (Python refuses int -> str past 4300 digits)
HANG_S = 30.0


@dataclass
class Faults:
    latency_ms: float = 0.0  # added to every tool request
    failure_rate: float = 0.0  # fraction of tool requests answered 503
    rate_limit_per_s: float = 0.0  # 0 = unlimited; above it answer 429 with Retry-After (one token bucket)
    hang_rate: float = 0.0  # fraction of tool requests that sleep 30 s before answering
    seed: int = 0  # faults drawn from random.Random(seed) so runs repeat

    def __post_init__(self) -> None:
        for key in ("latency_ms", "failure_rate", "rate_limit_per_s", "hang_rate"):
            if not 0 <= getattr(self, key) <= (1 if key.endswith("_rate") else math.inf):
                raise ValueError(f"Faults.{key} must be >= 0 (and <= 1 for a rate), got {getattr(self, key)!r}")


class CalculatorError(ValueError):
    """The expression is not plain arithmetic, or its value cannot be given."""


_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _describe(node: ast.AST) -> str:
    if isinstance(node, (ast.Name, ast.Constant)):
        return f"name {node.id!r}" if isinstance(node, ast.Name) else f"constant {node.value!r}"
    return {ast.Call: "a function call", ast.Attribute: "attribute access"}.get(type(node), type(node).__name__)


def _check_power(base: int | float, exponent: int | float) -> None:
    if abs(exponent) > MAX_EXPONENT:
        raise CalculatorError(f"exponent {exponent:g} is larger than {MAX_EXPONENT}")
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and abs(base) > 1:
        if (abs(base).bit_length() - 1) * exponent > MAX_INT_BITS:
            raise CalculatorError("result too large")


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float) and math.isfinite(node.value):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        value = _BINARY[type(node.op)](left, right)
        if isinstance(value, complex):
            raise CalculatorError("the result is a complex number")
        if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
            raise CalculatorError("result too large")
        return value
    raise CalculatorError(f"{_describe(node)} is not allowed; use numbers, + - * / // % ** and parentheses")


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic expression, walked over its AST (never eval)."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:  # ValueError: a null byte
        raise CalculatorError(f"not an arithmetic expression: {getattr(exc, 'msg', None) or exc}") from None
    try:
        value = _eval(tree.body)
    except ZeroDivisionError:
        raise CalculatorError("division by zero") from None
    except OverflowError:
        raise CalculatorError("result too large") from None
    except RecursionError:
        raise CalculatorError("expression nested too deeply") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("the result is not a finite number")
    return value


class ServiceState:
    """Tables, current faults, the token bucket and request counters of one app (thread-safe)."""

    def __init__(self, tables: dict[str, dict[str, Any]], faults: Faults) -> None:
        self.tables = tables
        self.closing = False  # set by ToolService.stop so hung requests end at once
        self._lock = threading.Lock()
        self.requests, self.injected = Counter(), Counter()  # by endpoint; by injected fault
        self.set_faults(faults)

    def set_faults(self, faults: Faults) -> None:
        with self._lock:
            self.faults = faults
            self._rng = random.Random(faults.seed)
            self._tokens = max(1.0, faults.rate_limit_per_s)
            self._refilled_at = time.monotonic()

    def admit(self, endpoint: str, faulted: bool = True) -> tuple[int | None, float, bool]:
        """Count a request; for a faulted one decide (Retry-After if rate limited, delay_s, fail)."""
        with self._lock:
            self.requests[endpoint] += 1
            faults, rate = self.faults, self.faults.rate_limit_per_s
            if not faulted:
                return None, 0.0, False
            if rate > 0:
                now = time.monotonic()
                self._tokens = min(max(1.0, rate), self._tokens + (now - self._refilled_at) * rate)
                self._refilled_at = now
                if self._tokens < 1.0:
                    self.injected["rate_limited"] += 1
                    return max(1, math.ceil((1.0 - self._tokens) / rate)), 0.0, False
                self._tokens -= 1.0
            hang = self._rng.random() < faults.hang_rate
            fail = self._rng.random() < faults.failure_rate
            for fault, on in (("hang", hang), ("failure", fail), ("latency", faults.latency_ms > 0)):
                self.injected[fault] += on
            return None, faults.latency_ms / 1000.0 + (HANG_S if hang else 0.0), fail

    def stats(self) -> dict:
        with self._lock:
            return {"requests": dict(self.requests), "faults": dict(self.injected)}

    async def apply_faults(self, endpoint: str) -> None:
        retry_after, delay_s, fail = self.admit(endpoint)
        if retry_after is not None:
            raise HTTPException(429, "rate limited", headers={"Retry-After": str(retry_after)})
        deadline = time.monotonic() + delay_s
        while not self.closing and (left := deadline - time.monotonic()) > 0:
            await asyncio.sleep(min(left, 0.05))
        if fail:
            raise HTTPException(503, "injected failure")


class CalculatorRequest(BaseModel):
    expression: str


class TableRequest(BaseModel):
    table: str


class LookupRequest(TableRequest):
    key: str


def create_app(tables: dict[str, dict[str, Any]], faults: Faults | None = None) -> FastAPI:
    state = ServiceState(tables, faults or Faults())
    app = FastAPI(title="agentrl tool service (test double)")
    app.state.tool_service = state

    def table(name: str) -> dict[str, Any]:
        if name not in state.tables:
            raise HTTPException(404, f"unknown table {name!r}; tables: {', '.join(sorted(state.tables))}")
        return state.tables[name]

    @app.get("/health")
    async def health() -> dict:
        state.admit("/health", faulted=False)
        return {"status": "ok"}

    @app.post("/tools/calculator")
    async def calculator(body: CalculatorRequest) -> dict:
        await state.apply_faults("/tools/calculator")
        try:
            return {"result": evaluate(body.expression)}
        except CalculatorError as exc:
            raise HTTPException(422, str(exc)) from None

    @app.post("/tools/lookup")
    async def lookup(body: LookupRequest) -> dict:
        await state.apply_faults("/tools/lookup")
        rows = table(body.table)
        return {"results": [rows[body.key]] if body.key in rows else []}

    @app.post("/tools/list_keys")
    async def list_keys(body: TableRequest) -> dict:
        await state.apply_faults("/tools/list_keys")
        return {"results": sorted(table(body.table))}

    @app.api_route("/admin/faults", methods=["GET", "POST"])
    async def faults_endpoint(body: Faults | None = None) -> dict:
        """GET reads the faults; POST replaces them (and reseeds the fault draws, refills the bucket)."""
        state.admit("/admin/faults", faulted=False)
        if body is not None:
            state.set_faults(body)
        return asdict(state.faults)

    @app.get("/admin/stats")
    async def stats() -> dict:
        state.admit("/admin/stats", faulted=False)
        return state.stats()

    return app


class ToolService:
    """`create_app` served by uvicorn in a daemon thread on an ephemeral loopback port. The host must
    be loopback unless `allow_non_loopback=True`: this fault-injecting service is for tests."""

    def __init__(self, tables: dict[str, dict[str, Any]], faults: Faults | None = None, host: str = "127.0.0.1",
                 port: int = 0, *, allow_non_loopback: bool = False, startup_timeout_s: float = 10.0) -> None:
        self.app = create_app(tables, faults)
        self.state: ServiceState = self.app.state.tool_service
        self._server = ServerThread(self.app, host, port, name="tool service", allow_non_loopback=allow_non_loopback,
                                    startup_timeout_s=startup_timeout_s)

    @property
    def url(self) -> str:
        return self._server.url

    def start(self) -> "ToolService":
        self.state.closing = False
        self._server.start()
        return self

    def set_faults(self, faults: Faults) -> None:
        self.state.set_faults(faults)

    def stats(self) -> dict:
        return self.state.stats()

    def stop(self) -> None:
        self.state.closing = True
        self._server.stop()

    def __enter__(self) -> "ToolService":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
