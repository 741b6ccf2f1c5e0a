"""The health endpoint of a control-plane instance (`controlplane.host`:`controlplane.port`): what the
Kubernetes probes and Service of the rendered Deployment read.

GET /health answers 200 while the instance's lease loop reaches the state store (its last successful
step no older than two leases, or the instance started less than two leases ago), else 503; the body
names the instance, whether it leads, its term and the holder of the lease. Nothing here writes.
"""

from __future__ import annotations

import time

from fastapi import FastAPI
from fastapi.responses import JSONResponse


def health(cp) -> tuple[bool, dict]:
    """(healthy, body) for a ControlPlane `cp`."""
    now, window = time.monotonic(), 2 * cp.cfg.controlplane.lease_seconds
    ago = None if cp.last_ok is None else now - cp.last_ok
    ok = ago <= window if ago is not None else now - cp.started_at <= window
    state = cp.state
    return ok, {"ok": ok, "instance": cp.instance_id, "leader": bool(state and state.leader),
                "term": state.term if state else 0, "holder": state.holder if state else None,
                "last_ok_s_ago": None if ago is None else round(ago, 3)}


def create_app(cp) -> FastAPI:
    app = FastAPI(title="agentrl control plane", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/health")
    def get_health() -> JSONResponse:
        ok, body = health(cp)
        return JSONResponse(body, status_code=200 if ok else 503)

    return app
