"""`agentrl sandbox run|check` as an operator uses them."""

from __future__ import annotations

import json
import shutil

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")]


def test_run_prints_output_and_exits_with_the_command_code(cli):
    result = cli("sandbox", "run", "--", "python3", "-c", "import sys; print(6 * 7); sys.exit(3)")
    assert result.exit_code == 3
    assert result.stdout == "42\n" and "status=error exit=3" in result.stderr


def test_run_times_out_with_124(cli):
    result = cli("sandbox", "run", "--timeout", "1", "--", "sleep", "30")
    assert result.exit_code == 124 and "stopped by wall_timeout" in result.stderr


def test_run_json_reports_the_sandbox_and_the_limits(cli):
    result = cli("sandbox", "run", "--json", "--memory-mb", "64", "--", "python3", "-c", "x = bytearray(1 << 30)")
    data = json.loads(result.stdout)
    assert result.exit_code == 137
    assert data["status"] == "error"
    assert data["sandbox"]["isolated"] is True
    if data["sandbox"]["cgroups"] != "none (rlimits)":
        assert data["killed_reason"] == "memory"


def test_run_a_shell_string_cannot_see_the_network(cli):
    result = cli("sandbox", "run", "cat /proc/net/dev | tail -n +3 | cut -d: -f1")
    assert result.exit_code == 0 and result.stdout.split() == ["lo"]


def test_check_reports_isolation(cli):
    result, facts = cli.json("sandbox", "check")
    assert result.exit_code == 0
    assert facts["bwrap"].endswith("bwrap") and facts["namespaces"].startswith("user")


def test_missing_bubblewrap_is_a_clear_refusal(cli):
    result = cli("sandbox", "run", "--set", "sandbox.bwrap=/nonexistent/bwrap", "--", "true")
    assert result.exit_code == 2 and "apt-get install bubblewrap" in result.stderr


def test_serve_sandbox_runs_the_http_service(tmp_path):
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    import httpx

    from tests.conftest import free_port

    port = free_port()
    agentrl = Path(sys.executable).parent / "agentrl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTRL_")}
    key_file = tmp_path / "sandbox.key"
    key_file.write_text("sandbox-key-0123456789abcdef\n")
    env["AGENTRL_SANDBOX__API_KEY_FILE"] = str(key_file)
    auth = {"Authorization": "Bearer sandbox-key-0123456789abcdef"}
    proc = subprocess.Popen([str(agentrl), "serve", "sandbox", "--port", str(port), "--set", "sandbox.pool_size=1"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.05)
        assert httpx.post(f"{url}/sandboxes", timeout=30).status_code == 401  # no key, no sandbox
        sb = httpx.post(f"{url}/sandboxes", headers=auth, timeout=30).json()
        r = httpx.post(f"{url}/sandboxes/{sb['id']}/exec", headers=auth, json={"command": "echo $((6*7))"}, timeout=30).json()
        assert r["stdout"] == "42\n" and r["status"] == "ok" and sb["isolated"] is True
    finally:
        proc.terminate()
        proc.wait(timeout=30)
