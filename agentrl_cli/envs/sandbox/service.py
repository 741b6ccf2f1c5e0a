"""The sandbox pool as an HTTP service (`agentrl serve sandbox`), for clusters where sandboxes run
in their own pods: create, exec, files, reset (destroy and start anew), close, health, metrics.

Endpoints (JSON unless noted):
    GET  /health                         {"status": "ok", "backend", "isolated", "replica", "images": [digest]}
    GET  /metrics                        Prometheus text: pool counters and gauges (per image: label digest)
    POST /images                         {"image", "digest"} -> {"image", "digest"} once its warm pool exists;
                                         409 {"message", "hint", "digest", "available"} when the service has no such image
    POST /sandboxes                      optional {"image", "digest"}: a sandbox rooted in that image (409 as
                                         above), else in the host's root -> {"id", "isolated", "workdir", "replica", "digest"}
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

Images (`service_images.py`): a sandbox in an image comes from that digest's own warm pool; the
service finds the digest in its image cache or its configured images, else refuses (409), never
running the sandbox on its host's root instead.

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
from agentrl_cli.envs.sandbox.service_images import ImageUnavailable, ServiceImages
from agentrl_cli.core.security import AuditLog, BearerAuth, KeyRing

MAX_FILE_BYTES = 16 * 1024 * 1024


class ExecRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    command: str | list[str] = Field(min_length=1)
    timeout: float | None = Field(None, gt=0, le=3600)
    stdin: str | None = None
    env: dict[str, str] | None = None
    cpu_time_s: int | None = Field(None, ge=1)


class ImageRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    image: str = Field("", max_length=4096)  # the client's reference: a name for messages, never opened here
    digest: str = Field("", max_length=80)


class _PoolCollector:
    def __init__(self, pool: SandboxPool, images: ServiceImages | None) -> None:
        self.pool, self.images = pool, images

    def collect(self):
        for key, value in self.pool.metrics().items():
            yield GaugeMetricFamily(f"agentrl_sandbox_pool_{key}", f"sandbox pool: {key.replace('_', ' ')}", value=value)
        families: dict[str, GaugeMetricFamily] = {}
        for digest, metrics in (self.images.metrics() if self.images else {}).items():
            for key, value in metrics.items():
                fam = families.setdefault(key, GaugeMetricFamily(f"agentrl_sandbox_image_pool_{key}",
                                                                 f"sandbox pool of one image: {key.replace('_', ' ')}", labels=["digest"]))
                fam.add_metric([digest], value)
        yield from families.values()


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
               replica: str = "", images: ServiceImages | None = None) -> FastAPI:
    """`keys`: the bearer keys required (None: none); `audit`: where executions, writes and refusals are
    recorded; `replica`: this replica's name (sandbox.replica; '' = the only one); `images`: the
    images it runs (None: none, every request naming one is refused)."""
    app = FastAPI(title="agentrl sandbox service")
    app.add_middleware(BearerAuth, keys=KeyRing.coerce(keys), service="sandbox", audit=audit)
    live: dict[str, tuple[Sandbox, SandboxPool]] = {}
    lock = threading.Lock()
    registry = CollectorRegistry()
    registry.register(_PoolCollector(pool, images))

    def pool_of(req: ImageRequest | None) -> SandboxPool:
        if req is None or not (req.image or req.digest):
            return pool
        try:
            if images is None:
                raise ImageUnavailable(req.image or req.digest, f"this sandbox service runs no images (asked for {req.digest or 'no digest'})",
                                       "start it with `agentrl serve sandbox` from this agentrl, which runs images")
            return images.pool(req.image, req.digest)
        except ImageUnavailable as exc:
            raise HTTPException(409, {"message": exc.message, "hint": exc.hint, "digest": req.digest,
                                      "available": images.digests() if images else []}) from None

    def get(sid: str) -> Sandbox:
        with lock:
            sb = live.get(sid, (None, None))[0]
        if sb is None:
            if replica and owner(sid) != replica:
                raise HTTPException(421, f"sandbox {sid!r} is replica {owner(sid) or '(none)'}'s, this is replica {replica!r}: "
                                         "send a sandbox's calls to the replica that created it (sandbox.replica_url)")
            raise HTTPException(404, f"no sandbox {sid!r}{f' on replica {replica!r}' if replica else ''} (closed, "
                                     "or this service restarted since); create one with POST /sandboxes")
        return sb

    def describe(sid: str, sb: Sandbox) -> dict:
        return {"id": sid, "isolated": sb.isolated, "workdir": "/work" if sb.isolated else str(sb.workdir), "replica": replica,
                "digest": sb.settings.image_digest}

    def create(source: SandboxPool) -> dict:
        try:
            sb = source.acquire(timeout=60)
        except PoolExhausted as exc:
            raise HTTPException(503, f"{exc.message}; {exc.hint}") from None
        sid = f"{replica}.{sb.id}" if replica else sb.id
        with lock:
            live[sid] = (sb, source)
        return describe(sid, sb)

    def release(sid: str) -> SandboxPool | None:
        with lock:
            sb, source = live.pop(sid, (None, None))
        if sb is not None:
            source.release(sb)
        return source

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok", "backend": pool.settings.backend, "isolated": pool.settings.backend == "bwrap", "replica": replica,
                "images": images.digests() if images else []}

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type="text/plain; version=0.0.4")

    @app.post("/images")
    def prepare_image(req: ImageRequest) -> dict:
        source = pool_of(req)
        return {"image": source.settings.image, "digest": source.settings.image_digest}

    @app.post("/sandboxes")
    def create_sandbox(req: ImageRequest | None = None) -> dict:
        return create(pool_of(req))

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
        return create(release(sid) or pool)

    @app.delete("/sandboxes/{sid}", status_code=204)
    def close(sid: str) -> Response:
        get(sid)
        release(sid)
        return Response(status_code=204)

    return app
