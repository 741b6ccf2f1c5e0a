"""`agentrl serve reward`: the scorer over HTTP (FastAPI).

POST /score (one ScoreRequest) and POST /score_batch ({"items": [...]}) return RewardResults;
GET /health, GET /info (verifier versions, the `reward.verifiers` components, weights, quarantine),
GET /metrics (Prometheus).
With `keys` (reward.api_key) every endpoint but /health and /metrics needs one of them as a bearer
token (401 otherwise, audited); scoring itself is not audited (it changes nothing).
Malformed input gets 422 with every offending field named (`{"error", "fields": [{"field",
"problem"}]}`) and never a score; an idempotency_key that is not the content hash gets 409. The
per-request deadline is the scorer's (reward.timeout_s); an exhausted verifier is `infra_error`.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily
from starlette.concurrency import run_in_threadpool

from agentrl_cli.runtime.reward.models import BatchRequest, BatchResult, RewardResult, ScoreRequest
from agentrl_cli.runtime.reward.scorer import IdempotencyMismatch, Scorer
from agentrl_cli.core.security import AuditLog, BearerAuth, KeyRing


class _Counters:
    def __init__(self, scorer: Scorer) -> None:
        self.scorer = scorer

    def collect(self):
        for key, value in sorted(self.scorer.counters.items()):
            yield CounterMetricFamily(f"agentrl_reward_{key}", f"reward service: {key.replace('_', ' ')}", value=value)


def _field_errors(exc: RequestValidationError) -> list[dict]:
    out = []
    for e in exc.errors():
        loc = [str(p) for p in e.get("loc", ()) if p != "body"]
        out.append({"field": ".".join(loc) or "(body)", "problem": e.get("msg", "invalid")})
    return out


def create_app(scorer: Scorer, *, keys: KeyRing | str | None = None, audit: AuditLog | None = None) -> FastAPI:
    """`keys`: the bearer keys required (None: none); `audit`: where refused requests are recorded."""
    app = FastAPI(title="agentrl reward service")
    app.add_middleware(BearerAuth, keys=KeyRing.coerce(keys), service="reward", audit=audit,
                       audited=lambda method, path: False)
    registry = CollectorRegistry()
    registry.register(_Counters(scorer))

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        scorer.counters["rejected_requests"] += 1
        return JSONResponse({"error": "invalid scoring request; nothing was scored", "fields": _field_errors(exc)},
                            status_code=422)

    @app.exception_handler(IdempotencyMismatch)
    async def mismatch(_: Request, exc: IdempotencyMismatch) -> JSONResponse:
        scorer.counters["rejected_requests"] += 1
        return JSONResponse({"error": str(exc), "fields": [{"field": "idempotency_key", "problem": str(exc)}]},
                            status_code=409)

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok"}

    @app.get("/info")
    def info() -> dict:
        return {"verifier_versions": scorer.versions(), "components": sorted(scorer.components), "weights": scorer.weights,
                "timeout_s": scorer.timeout_s, "max_retries": scorer.max_retries, "quarantined": scorer.quarantined}

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type="text/plain; version=0.0.4")

    @app.post("/score", response_model=RewardResult)
    async def score(req: ScoreRequest) -> RewardResult:
        return await run_in_threadpool(scorer.score, req)

    @app.post("/score_batch", response_model=BatchResult)
    async def score_batch(batch: BatchRequest) -> BatchResult:
        return BatchResult(results=await run_in_threadpool(scorer.score_batch, batch.items))

    return app
