"""The HTTP API of a control-plane instance (`controlplane.host`:`controlplane.port`): its health,
which the Kubernetes probes and Service of the rendered Deployment read, and the job requests a
client makes without a database connection of its own.

    GET  /health                 200 while the lease loop reaches the store (its last successful step no
                                 older than two leases, or started less than two leases ago), else 503;
                                 the body names the instance, whether it leads, its term and the lease holder
    GET  /jobs[?all=true]        the jobs, newest first (active ones unless all)
    GET  /jobs/{id}              one job
    POST /jobs                   {"pool", "command": [..], "priority"?, "cpus"?} -> 201 the queued job
    POST /jobs/{id}/cancel       ask for a cancel -> the job

Everything but /health takes one of `keys` (controlplane.api_key) as a bearer token (401 otherwise);
every write and every refused request is an audit line (`core/security/audit.py`). The leader's loop hands
queued jobs to the executor and acts on cancel requests; this app only records the requests, each
with its own connection to the state store (a connection is not shared between threads).
"""

from __future__ import annotations

import time

from fastapi import FastAPI, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from agentrl_cli.core.errors import NotFoundError, UsageError
from agentrl_cli.core.security import AuditLog, BearerAuth, KeyRing, service_keys


def health(cp) -> tuple[bool, dict]:
    """(healthy, body) for a ControlPlane `cp`."""
    now, window = time.monotonic(), 2 * cp.cfg.controlplane.lease_seconds
    ago = None if cp.last_ok is None else now - cp.last_ok
    ok = ago <= window if ago is not None else now - cp.started_at <= window
    state = cp.state
    return ok, {"ok": ok, "instance": cp.instance_id, "leader": bool(state and state.leader),
                "term": state.term if state else 0, "holder": state.holder if state else None,
                "last_ok_s_ago": None if ago is None else round(ago, 3)}


class JobRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pool: str = Field(min_length=1)
    command: list[str] = Field(min_length=1)
    priority: str | None = None
    cpus: int = Field(1, ge=1)


_DEFAULT = object()


def create_app(cp, *, keys=_DEFAULT, audit=_DEFAULT) -> FastAPI:
    """The instance's app. `keys` and `audit` default to what `cp.cfg` says (controlplane.api_key,
    observe.audit_log); pass None for no key, or no audit."""
    from agentrl_cli.ops.controlplane.executor import pool_named, priority_value
    from agentrl_cli.ops.controlplane.registry import Registry
    from agentrl_cli.ops.controlplane.store import StateStore

    cfg = cp.cfg
    keys = service_keys(cfg, "controlplane") if keys is _DEFAULT else KeyRing.coerce(keys)
    audit = AuditLog.from_config(cfg, "controlplane") if audit is _DEFAULT else audit
    app = FastAPI(title="agentrl control plane", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(BearerAuth, keys=keys, service="controlplane", audit=audit)

    def registry() -> tuple[StateStore, Registry]:
        store = StateStore(cfg.controlplane.state_store)
        return store, Registry(store)

    @app.exception_handler(NotFoundError)
    async def not_found(_, exc: NotFoundError) -> JSONResponse:
        return JSONResponse({"error": exc.message, "hint": exc.hint}, status_code=404)

    @app.exception_handler(UsageError)
    async def refused(_, exc: UsageError) -> JSONResponse:
        return JSONResponse({"error": exc.message, "hint": exc.hint}, status_code=400)

    @app.get("/health")
    def get_health() -> JSONResponse:
        ok, body = health(cp)
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/jobs")
    def list_jobs(all: bool = Query(False, description="include finished jobs")) -> list[dict]:  # noqa: A002 - the query parameter's name
        from agentrl_cli.ops.controlplane.executor import ACTIVE

        store, reg = registry()
        with store:
            return reg.jobs(None if all else ACTIVE)

    @app.get("/jobs/{job_id}")
    def get_job(job_id: str) -> dict:
        store, reg = registry()
        with store:
            return reg.job(job_id)

    @app.post("/jobs", status_code=201)
    def submit(req: JobRequest) -> dict:
        capacity = pool_named(cfg.controlplane, req.pool).capacity
        if req.cpus > capacity:
            raise UsageError(f"cpus {req.cpus} is more than pool {req.pool} has ({capacity})",
                             f"ask for at most {capacity}, or raise the pool's capacity (controlplane.pools)")
        name, value = priority_value(cfg.controlplane, req.priority)
        store, reg = registry()
        with store:
            return reg.submit_job(req.pool, name, value, req.command, req.cpus, cfg.controlplane.executor,
                                  cfg.controlplane.jobs_dir)

    @app.post("/jobs/{job_id}/cancel")
    def cancel(job_id: str) -> dict:
        store, reg = registry()
        with store:
            return reg.request_cancel(job_id)

    return app
