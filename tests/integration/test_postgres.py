"""The state store on a real PostgreSQL (Debian's server, initdb + pg_ctl on a temp dir and a free loopback
port): the lease contract, and two `agentrl controlplane serve` processes where killing the leader hands
leadership to the follower and a write carrying the old fencing token is refused."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from agentrl_cli.ops.controlplane.lease import cluster_view
from agentrl_cli.ops.controlplane.registry import Registry
from agentrl_cli.ops.controlplane.service import wait_for
from agentrl_cli.ops.controlplane.store import FencedOut, StateStore
from tests.controlplane_services import postgres_missing, start_postgres
from tests.unit.test_controlplane_store import lease_contract

pytestmark = pytest.mark.integration
LEASE_S = 1.0


@pytest.fixture(scope="module")
def pg_url():
    why = postgres_missing()
    if why:
        pytest.skip(why)
    svc = start_postgres()
    yield svc.info["url"]
    svc.stop()


def test_one_leader_takeover_and_a_stale_token_is_refused_on_postgres(pg_url):
    lease_contract(pg_url)
    with StateStore(pg_url) as store:  # a second migration of the same database is a no-op
        assert store.migrate() == store.schema_version()


def _serve(url: str, cwd) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTRL_")}
    return subprocess.Popen([sys.executable, "-m", "agentrl_cli", "controlplane", "serve", "--json",
                             "--set", f"controlplane.state_store={url}", "--set", f"controlplane.lease_seconds={LEASE_S}"],
                            cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def _wait(store: StateStore, ok, deadline_s: float) -> dict:
    deadline = time.monotonic() + deadline_s
    while True:
        view = cluster_view(store, LEASE_S)
        if ok(view) or time.monotonic() > deadline:
            return view
        time.sleep(0.05)


@pytest.mark.e2e
def test_killing_the_leader_hands_over_within_the_lease_and_its_token_is_refused(pg_url, tmp_path):
    store = StateStore(pg_url)
    procs = [_serve(pg_url, tmp_path) for _ in range(2)]
    try:
        view = _wait(store, lambda v: len(v["instances"]) == 2 and v["leader"] in {i["id"] for i in v["instances"]}, 90)
        assert view["leader"] and len(view["instances"]) == 2, view
        assert sum(i["believes_leader"] for i in view["instances"]) == 1
        leader = next(i for i in view["instances"] if i["id"] == view["leader"])
        victim = next(p for p in procs if p.pid == leader["pid"])
        # the leader hands a submitted job to the executor and records its end, each write fenced with its term
        registry = Registry(store)
        job = registry.submit_job("rollout", "low", 100, ["sh", "-c", "echo hi"], 1, "local", "runs/jobs")
        job = wait_for(registry, job["id"], lambda j: j["state"] == "succeeded", 60)
        assert job["state"] == "succeeded" and job["fence"] == view["term"] and job["pool"] == "rollout"
        t_kill = time.monotonic()
        victim.send_signal(signal.SIGKILL)
        after = _wait(store, lambda v: v["leader"] and v["leader"] != leader["id"], 10 * LEASE_S)
        failover_s = time.monotonic() - t_kill
        assert after["leader"] and after["leader"] != leader["id"] and after["term"] == view["term"] + 1
        # guaranteed bound: the lease plus one renew interval (lease/3); one more lease of slack for a loaded CI box
        assert failover_s <= LEASE_S * (1 + 1 / 3) + LEASE_S, failover_s
        with pytest.raises(FencedOut, match=f"token {view['term']} is stale"):
            Registry(store).update_job(view["term"], job["id"], state="cancelled")
        survivor = next(p for p in procs if p is not victim)
        survivor.send_signal(signal.SIGTERM)  # a clean stop releases the lease at once
        assert survivor.wait(timeout=30) == 0
        events = [json.loads(line) for line in survivor.stdout.read().decode().splitlines() if line.startswith("{")]
        assert [e["leader"] for e in events][-1] is True
        assert cluster_view(store, LEASE_S)["leader"] == ""
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        store.close()
