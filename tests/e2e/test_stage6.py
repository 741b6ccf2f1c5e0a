"""`agentrl stage run 6` and `agentrl serve reward` as a user runs them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.integration,
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")]


def test_stage_6_passes_with_measured_values(cli):
    # the throughput floor is a performance target, not behaviour: a loaded CI machine must not fail it
    result, data = cli.json("stage", "run", "6", "--set", "stages.reward_min_scores_per_s=1")
    report = data["reports"][0]
    failing = [(c["name"], c["detail"][:200]) for c in report["checks"] if c["status"] != "pass"]
    assert result.exit_code == 0 and report["status"] == "pass", failing
    by_name = {c["name"]: c for c in report["checks"]}
    assert {"same input twice, same result", "idempotency key returns the cached result",
            "bad input: explicit error, never a score", "failure classes kept apart",
            "tampering with the visible tests is flagged", "null/gold check of every task family", "throughput"} <= set(by_name)
    assert by_name["throughput"]["measured"]["scores_per_s"] > 0
    assert report["environment"]["verifier_versions"]["tests"]


def test_stage_6_fails_with_a_hint_when_the_configured_service_is_down(cli):
    result, data = cli.json("stage", "run", "6", "--set", f"reward.service_url=http://127.0.0.1:{free_port()}")
    checks = data["reports"][0]["checks"]
    assert result.exit_code == 1 and checks[0]["name"] == "service healthy" and checks[0]["status"] == "fail"
    assert "agentrl serve reward" in checks[0]["hint"] and checks[1]["status"] == "skip"


def test_serve_reward_scores_over_http(tmp_path):
    port = free_port()
    agentrl = Path(sys.executable).parent / "agentrl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTRL_")}
    proc = subprocess.Popen([str(agentrl), "serve", "reward", "--port", str(port)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.05)
        body = {"task": {"task_id": "t1", "harness": "terminal_like", "prompt": "2+2?", "answer": 4, "meta": {"verify": "answer"}},
                "trajectory_id": "tr-1", "steps": [{"action": "ANSWER: 4"}], "final_answer": "4"}
        r = httpx.post(f"{url}/score", json=body, timeout=30).json()
        assert (r["status"], r["outcome"], r["components"]["outcome"]) == ("ok", "success", 1.0)
        bad = httpx.post(f"{url}/score", json={**body, "steps": "nope"}, timeout=30)
        assert bad.status_code == 422 and bad.json()["fields"][0]["field"] == "steps"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
