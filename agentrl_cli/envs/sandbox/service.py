"""The sandbox pool as an HTTP service (`agentrl serve sandbox`), for clusters where sandboxes run
in their own pods: create, exec, files, reset (destroy and start anew), close, health, metrics.

Endpoints (JSON unless noted):
    GET  /health                         {"status": "ok", "backend", "isolated", "replica"}
    GET  /metrics                        Prometheus text: pool counters and gauges
    POST /sandboxes                      -> {"id", "isolated", "workdir", "replica"}
    POST /sandboxes/{id}/exec            {"command": str | [str], "timeout", "stdin", "env", "cpu_time_s"} -> ExecResult
    PUT  /sandboxes/{id}/files?path=P    body: raw bytes -> 204
    GET  /sandboxes/{id}/files?path=P    -> raw bytes (link-safe; 400 when the path leaves the sandbox)
    GET  /sandboxes/{id}/resources       -> what it used so far (Sandbox.resources: cpu_s, peak_memory_bytes,
                                            processes, open_files; null without cgroups)
    POST /sandboxes/{id}/reset           -> a new sandbox {"id", ...}; the old one is destroyed
    DELETE /sandboxes/{id}               -> 204

Replicas: a service started with a `replica` name (sandbox.replica; the rendered StatefulSet gives each
pod its own name) is one of several behind a load balancer. Its sandboxes' ids are `<replica>.<id>`
and its answers carry `replica`, so a client sends every call after the creation to that replica
(`remote.py`, sandbox.replica_url). A call for a sandbox this replica does not hold answers 404 (or
421 when its id names another replica: misrouted), which the client ends as `SandboxLost`.

Every endpoint but /health and /metrics takes one of `keys` (sandbox.api_key) as a bearer token (401
otherwise); each request that changes something (create, exec, file write, reset, close) and each
refused one is an audit line (`core/security/audit.py`). `check_exposure` is the rule for starting: the
service executes commands for whoever calls it, so without a key it serves only on loopback, and
only when told so (`--insecure-loopback`).
"""

from __future__ import annotations

import ipaddress
import threading

from fastapi import FastAPI, HTTPException, Request, Response
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from pydantic import BaseModel, ConfigDict, Field

from agentrl_cli.core.errors import UsageError
from agentrl_cli.envs.sandbox.files import UnsafePath
from agentrl_cli.envs.sandbox.pool import PoolExhausted, SandboxPool
from agentrl_cli.envs.sandbox.sandbox import Sandbox
from agentrl_cli.core.security import AuditLog, BearerAuth, KeyRing

MAX_FILE_BYTES = 16 * 1024 * 1024


class ExecRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    command: str | list[str] = Field(min_length=1)
    timeout: float | None = Field(None, gt=0, le=3600)
    stdin: str | None = None
    env: dict[str, str] | None = None
    cpu_time_s: int | None = Field(None, ge=1)


class _PoolCollector:
    def __init__(self, pool: SandboxPool) -> None:
        self.pool = pool

    def collect(self):
        for key, value in self.pool.metrics().items():
            yield GaugeMetricFamily(f"agentrl_sandbox_pool_{key}", f"sandbox pool: {key.replace('_', ' ')}", value=value)


def check_exposure(host: str, keys: KeyRing | None, insecure_loopback: bool) -> None:
    """Refuse (UsageError) to serve without a key unless on a loopback address with `insecure_loopback`."""
    if keys is not None:
        return
    try:
        loopback = ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        raise UsageError(f"the sandbox service would execute commands for anyone who reaches {host}: it needs a key",
                         "write one with `agentrl secrets rotate /path/sandbox.key` and start it with "
                         "AGENTRL_SANDBOX__API_KEY_FILE=/path/sandbox.key (clients: the same variable, and sandbox.service_url)")
    if not insecure_loopback:
        raise UsageError(f"the sandbox service has no key (sandbox.api_key) on {host}",
                         "give it one (AGENTRL_SANDBOX__API_KEY_FILE=/path/sandbox.key, written by `agentrl secrets "
                         "rotate`), or pass --insecure-loopback to serve this host's own processes without one")


def owner(sid: str) -> str:
    """The replica a sandbox id names (`<replica>.<id>`), '' for an id of a service without a replica name."""
    return sid.rpartition(".")[0]


def create_app(pool: SandboxPool, *, keys: KeyRing | str | None = None, audit: AuditLog | None = None,
               replica: str = "") -> FastAPI:
    """`keys`: the bearer keys required (None: none); `audit`: where executions, writes and refusals are
    recorded; `replica`: this replica's name (sandbox.replica; '' = the only one)."""
    app = FastAPI(title="agentrl sandbox service")
    app.add_middleware(BearerAuth, keys=KeyRing.coerce(keys), service="sandbox", audit=audit)
    live: dict[str, Sandbox] = {}
    lock = threading.Lock()
    registry = CollectorRegistry()
    registry.register(_PoolCollector(pool))

    def get(sid: str) -> Sandbox:
        with lock:
            sb = live.get(sid)
        if sb is None:
            if replica and owner(sid) != replica:
                raise HTTPException(421, f"sandbox {sid!r} is replica {owner(sid) or '(none)'}'s, this is replica {replica!r}: "
                                         "send a sandbox's calls to the replica that created it (sandbox.replica_url)")
            raise HTTPException(404, f"no sandbox {sid!r}{f' on replica {replica!r}' if replica else ''} (closed, "
                                     "or this service restarted since); create one with POST /sandboxes")
        return sb

    def describe(sid: str, sb: Sandbox) -> dict:
        return {"id": sid, "isolated": sb.isolated, "workdir": "/work" if sb.isolated else str(sb.workdir), "replica": replica}

    def create() -> dict:
        try:
            sb = pool.acquire(timeout=60)
        except PoolExhausted as exc:
            raise HTTPException(503, f"{exc.message}; {exc.hint}") from None
        sid = f"{replica}.{sb.id}" if replica else sb.id
        with lock:
            live[sid] = sb
        return describe(sid, sb)

    def release(sid: str) -> None:
        with lock:
            sb = live.pop(sid, None)
        if sb is not None:
            pool.release(sb)

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok", "backend": pool.settings.backend, "isolated": pool.settings.backend == "bwrap", "replica": replica}

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type="text/plain; version=0.0.4")

    @app.post("/sandboxes")
    def create_sandbox() -> dict:
        return create()

    @app.post("/sandboxes/{sid}/exec")
    def exec_(sid: str, req: ExecRequest) -> dict:
        r = get(sid).exec(req.command, timeout=req.timeout, stdin=req.stdin, env=req.env, cpu_time_s=req.cpu_time_s)
        return r.to_dict()

    @app.put("/sandboxes/{sid}/files", status_code=204)
    async def put_file(sid: str, path: str, request: Request) -> Response:
        sb = get(sid)
        data = await request.body()
        if len(data) > MAX_FILE_BYTES:
            raise HTTPException(413, f"file larger than {MAX_FILE_BYTES} bytes")
        try:
            sb.write_file(path, data)
        except UnsafePath as exc:
            raise HTTPException(400, exc.message) from None
        return Response(status_code=204)

    @app.get("/sandboxes/{sid}/files")
    def get_file(sid: str, path: str, max_bytes: int = 1 << 20) -> Response:
        try:
            data = get(sid).read_file(path, max_bytes=min(max_bytes, MAX_FILE_BYTES))
        except UnsafePath as exc:
            raise HTTPException(400, exc.message) from None
        return Response(data, media_type="application/octet-stream")

    @app.get("/sandboxes/{sid}/resources")
    def resources(sid: str) -> dict | None:
        return get(sid).resources()

    @app.post("/sandboxes/{sid}/reset")
    def reset(sid: str) -> dict:
        get(sid)
        release(sid)
        return create()

    @app.delete("/sandboxes/{sid}", status_code=204)
    def close(sid: str) -> Response:
        get(sid)
        release(sid)
        return Response(status_code=204)

    return app
