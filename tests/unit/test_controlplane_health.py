"""The control plane's health endpoint, which the rendered Deployment's probes and Service read: 200
with the instance's role while its lease loop reaches the store, 503 once the loop has stopped."""

from __future__ import annotations

import threading
import time

import httpx

from agentrl_cli.config.models import PlatformConfig
from agentrl_cli.ops.controlplane.health import create_app
from agentrl_cli.ops.controlplane.service import ControlPlane, open_store
from agentrl_cli.core.serving import ServerThread


class _NoExecutor:
    name = "none"


def test_health_follows_the_lease_loop(tmp_path):
    cfg = PlatformConfig.model_validate({"controlplane": {"state_store": f"sqlite:///{tmp_path}/state.db", "lease_seconds": 0.3}})
    store = open_store(cfg)
    cp = ControlPlane(cfg, store, _NoExecutor(), dispatch=False)
    server = ServerThread(create_app(cp), name="control-plane health").start()  # 200 while starting
    stop = threading.Event()
    loop = threading.Thread(target=cp.serve, args=(stop,), daemon=True)
    loop.start()
    try:
        deadline = time.monotonic() + 10
        while cp.last_ok is None and time.monotonic() < deadline:
            time.sleep(0.05)
        ok = httpx.get(f"{server.url}/health", timeout=5)
        assert ok.status_code == 200 and ok.json()["leader"] is True and ok.json()["instance"] == cp.instance_id
        stop.set()
        loop.join(timeout=5)
        time.sleep(2 * cfg.controlplane.lease_seconds + 0.2)  # the loop is gone: no step can have succeeded since
        gone = httpx.get(f"{server.url}/health", timeout=5)
        assert gone.status_code == 503 and gone.json()["ok"] is False
    finally:
        stop.set()
        server.stop()
        store.close()
