"""The sandbox service over HTTP: a harness plays an episode through it unchanged."""

from __future__ import annotations

import httpx
import pytest

from agentrl_cli.envs.sandbox import SandboxPool, SandboxSettings
from agentrl_cli.envs.sandbox.files import UnsafePath
from agentrl_cli.envs.sandbox.remote import RemoteProvider, SandboxLost
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


def test_a_named_replica_names_its_sandboxes_and_a_sandbox_it_lost_raises_sandbox_lost(sandbox_root):
    """A replica (sandbox.replica) puts its name in its sandboxes' ids and answers; the client sends their
    calls to sandbox.replica_url with that name; a call for another replica's sandbox is refused as
    misrouted (421), one for a sandbox it no longer holds 404, and either raises SandboxLost in the
    client instead of returning an error result the agent would be shown again and again."""
    pool = SandboxPool(SandboxSettings(root_dir=sandbox_root), size=1, max_concurrency=4)
    server = ServerThread(create_app(pool, replica="127.0.0.1"), name="sandbox replica").start()
    provider = RemoteProvider(server.url, replica_url=f"http://{{replica}}:{server.port}")
    try:
        assert httpx.get(f"{server.url}/health").json()["replica"] == "127.0.0.1"
        sb = provider.acquire()
        assert sb.replica == "127.0.0.1" and sb.id.startswith("127.0.0.1.")
        assert sb.exec("echo hi").stdout == "hi\n"
        refused = sb.exec([])  # a request the service refuses is the caller's error, the sandbox lives on
        assert refused.status == "error" and refused.killed_reason is None and "(422)" in refused.error
        elsewhere = httpx.post(f"{server.url}/sandboxes/127.0.0.9.{sb.id.rpartition('.')[2]}/exec", json={"command": "true"})
        assert elsewhere.status_code == 421 and "sandbox.replica_url" in elsewhere.json()["detail"]
        assert httpx.post(f"{server.url}/sandboxes/127.0.0.1.0-0-000000/exec", json={"command": "true"}).status_code == 404
        assert httpx.delete(f"{server.url}/sandboxes/{sb.id}").status_code == 204  # gone behind the client's back
        with pytest.raises(SandboxLost, match="on replica 127.0.0.1 .* answered 404"):
            sb.exec("true")
        with pytest.raises(SandboxLost):
            sb.write_file("a.txt", "x")
        with pytest.raises(SandboxLost):
            sb.read_file("a.txt")
        assert sb.resources() is None
        provider.release(sb)
        assert pool.metrics()["in_use"] == 0
    finally:
        provider.close()
        server.stop()
        pool.close()
