"""The sandbox service over HTTP: a harness plays an episode through it unchanged."""

from __future__ import annotations

import httpx
import pytest

from agentrl_cli.envs.sandbox import SandboxPool, SandboxSettings
from agentrl_cli.envs.sandbox.files import UnsafePath
from agentrl_cli.envs.sandbox.remote import RemoteProvider
from agentrl_cli.envs.sandbox.service import create_app
from agentrl_cli.core.serving import ServerThread
from harnesses.contract import play
from harnesses.tasks import load_tasks
from harnesses.terminal_like import TerminalLike
from tests.integration.conftest import needs_bwrap

pytestmark = [pytest.mark.integration, needs_bwrap]


@pytest.fixture
def service(sandbox_root):
    pool = SandboxPool(SandboxSettings(root_dir=sandbox_root), size=2, max_concurrency=8)
    server = ServerThread(create_app(pool), name="sandbox service").start()
    yield server, pool
    server.stop()
    pool.close()


def test_harness_plays_through_the_remote_pool(service):
    server, pool = service
    provider = RemoteProvider(server.url)
    h = TerminalLike(sandboxes=provider)
    for family in ("sum_column", "uppercase_file"):
        task = load_tasks("terminal_like", "eval", family)[0]
        traj, last = play(h, task)
        assert last.done and h.compute_reward(traj) == 1.0
    h.close()
    provider.close()
    assert pool.metrics()["in_use"] == 0


def test_exec_limits_files_and_errors_over_http(service):
    server, pool = service
    provider = RemoteProvider(server.url)
    sb = provider.acquire()
    assert sb.exec("sleep 30", timeout=0.5).status == "timeout"
    sb.write_file("a/b.txt", "hello")
    assert sb.read_file("a/b.txt") == b"hello"
    sb.exec("ln -s /etc/passwd leak")
    with pytest.raises(UnsafePath):
        sb.read_file("leak")
    with pytest.raises(UnsafePath):
        sb.write_file("../escape", "x")
    assert httpx.post(f"{server.url}/sandboxes/nope/exec", json={"command": "true"}).status_code == 404
    assert httpx.post(f"{server.url}/sandboxes/{sb.id}/exec", json={"command": []}).status_code == 422
    reset = httpx.post(f"{server.url}/sandboxes/{sb.id}/reset").json()
    assert reset["id"] != sb.id
    assert httpx.post(f"{server.url}/sandboxes/{sb.id}/exec", json={"command": "true"}).status_code == 404
    assert httpx.delete(f"{server.url}/sandboxes/{reset['id']}").status_code == 204
    metrics = httpx.get(f"{server.url}/metrics").text
    assert "agentrl_sandbox_pool_created" in metrics and "agentrl_sandbox_pool_leaked_processes 0.0" in metrics
    provider.close()
