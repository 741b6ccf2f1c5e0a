"""Every service authenticates: the reward service, the sandbox service, the control plane's API and
the gateway's session management, each served on loopback with its keys in a key file, refuse a
request without a key and one with a wrong key (401), take both keys during a rotation, refuse the
old one once it is retired, and leave audit lines (sandbox executions, control-plane writes, gateway
management, every refusal) that name keys by id and hold no key. `agentrl serve inference`, started
as its own process with the key in a file, carries no key in its command line and audits a weight
update."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from agentrl_cli.config.models import PlatformConfig
from agentrl_cli.engines.openai_api import OpenAIError
from agentrl_cli.core.security import AuditLog, KeyRing, key_id
from agentrl_cli.core.security.keys import read_key_file, retire_old, rotate
from agentrl_cli.core.serving import ServerThread
from tests.conftest import free_port

pytestmark = pytest.mark.integration


def score_request() -> dict:
    from harnesses.canaries import canary_tasks

    task = next(t for h in ("terminal_like", "tool_api_like") for t in canary_tasks(h) if t.meta.get("verify") == "answer")
    return {"task": {"task_id": task.task_id, "harness": task.harness, "prompt": task.prompt, "answer": task.answer,
                     "difficulty": task.difficulty, "split": task.split, "meta": task.meta},
            "trajectory_id": "auth-probe", "steps": [{"action": "probe"}], "final_answer": "0"}


class _StubGateway:
    """What the gateway app's management routes need, without a model behind it."""

    def __init__(self) -> None:
        self.counters: Counter = Counter()
        self.backend = type("NoModel", (), {"model_name": lambda self: "none"})()

    def open_sessions(self) -> int:
        return 0

    def stats(self) -> dict:
        return dict(self.counters)

    def close_session(self, session_id: str):
        raise OpenAIError(f"no open session {session_id!r}", status=404, type="not_found_error")


def _reward(keys: KeyRing, audit: AuditLog, tmp_path: Path):
    from agentrl_cli.runtime.reward.scorer import Scorer
    from agentrl_cli.runtime.reward.service import create_app

    scorer = Scorer()
    return create_app(scorer, keys=keys, audit=audit), ("POST", "/score", score_request(), 200, False), scorer.close


def _sandbox(keys: KeyRing, audit: AuditLog, tmp_path: Path):
    from agentrl_cli.envs.sandbox import SandboxPool, SandboxSettings
    from agentrl_cli.envs.sandbox.service import create_app

    pool = SandboxPool(SandboxSettings(backend="process", root_dir=tmp_path / "sandboxes"), size=0, max_concurrency=16)
    # a reset of a sandbox that is not there: a write, admitted and audited, that starts nothing
    return create_app(pool, keys=keys, audit=audit), ("POST", "/sandboxes/none/reset", None, 404, True), pool.close


def _controlplane(keys: KeyRing, audit: AuditLog, tmp_path: Path):
    from agentrl_cli.ops.controlplane.health import create_app
    from agentrl_cli.ops.controlplane.service import ControlPlane, open_store

    cfg = PlatformConfig.model_validate({"controlplane": {"state_store": f"sqlite:///{tmp_path}/state.db",
                                                          "jobs_dir": str(tmp_path / "jobs")}})
    store = open_store(cfg)
    cp = ControlPlane(cfg, store, executor=type("NoExecutor", (), {"name": "none"})(), dispatch=False)
    job = {"pool": "rollout", "command": ["echo", "hello"]}
    return create_app(cp, keys=keys, audit=audit), ("POST", "/jobs", job, 201, True), store.close


def _gateway(keys: KeyRing, audit: AuditLog, tmp_path: Path):
    from agentrl_cli.engines.gateway.app import create_app

    return create_app(_StubGateway(), admin_key=keys, audit=audit), ("DELETE", "/sessions/gone", None, 404, True), lambda: None


SERVICES = {"reward": _reward, "sandbox": _sandbox, "controlplane": _controlplane, "gateway": _gateway}


@pytest.fixture(params=sorted(SERVICES))
def keyed(request, tmp_path):
    key_file, audit_path = tmp_path / f"{request.param}.key", tmp_path / "audit.jsonl"
    rotate(key_file)
    app, call, close = SERVICES[request.param](KeyRing.from_file(key_file), AuditLog(audit_path, request.param), tmp_path)
    server = ServerThread(app, name=f"{request.param} service").start()
    yield request.param, server.url, key_file, audit_path, call
    server.stop()
    close()


def test_a_keyed_service_refuses_without_the_key_and_takes_both_keys_during_a_rotation(keyed):
    service, url, key_file, audit_path, (method, path, body, ok, audited) = keyed

    def call(key: str | None) -> int:
        headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
        return httpx.request(method, url + path, json=body, headers=headers, timeout=60).status_code

    [old] = read_key_file(key_file)
    assert httpx.get(url + "/health", timeout=10).status_code == 200  # probes carry no key
    assert call(None) == 401 and call("not-a-key") == 401 and call(old[:-1]) == 401
    assert call(old) == ok
    rotate(key_file)
    new = read_key_file(key_file)[0]
    assert call(new) == ok and call(old) == ok  # both valid while clients move over
    retire_old(key_file)
    assert call(old) == 401 and call(new) == ok

    text = audit_path.read_text()
    assert old not in text and new not in text
    lines = [json.loads(line) for line in text.splitlines()]
    assert all(r["service"] == service and r["endpoint"] == path for r in lines)
    refused = [r for r in lines if r["outcome"] == "unauthorized"]
    assert len(refused) == 4 and {r["key_id"] for r in refused} == {None} and {r["status"] for r in refused} == {401}
    accepted = [(r["key_id"], r["status"]) for r in lines if r["status"] != 401]
    expected = [(key_id(old), ok), (key_id(new), ok), (key_id(old), ok), (key_id(new), ok)]
    assert accepted == (expected if audited else [])  # scoring changes nothing: only its refusals are audited


def test_sandbox_executions_are_audited_with_the_key_id_and_the_client_sends_its_key(tmp_path):
    from agentrl_cli.envs.sandbox import SandboxPool, SandboxSettings
    from agentrl_cli.envs.sandbox.remote import RemoteProvider
    from agentrl_cli.envs.sandbox.service import create_app
    from agentrl_cli.core.errors import ConfigError

    key = "sandbox-key-0123456789abcdef"
    pool = SandboxPool(SandboxSettings(backend="process", root_dir=tmp_path / "sandboxes"), size=0, max_concurrency=4)
    server = ServerThread(create_app(pool, keys=key, audit=AuditLog(tmp_path / "audit.jsonl", "sandbox")),
                          name="sandbox service").start()
    try:
        with pytest.raises(ConfigError, match="refused this client's key"):
            RemoteProvider(server.url, api_key="wrong-key-0123456789").acquire()
        provider = RemoteProvider(server.url, api_key=key)
        sb = provider.acquire()
        assert sb.exec("echo hi").stdout.strip() == "hi"
        sb.close()
        provider.close()
    finally:
        server.stop()
        pool.close()
    lines = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [(r["method"], r["endpoint"].split("/")[-1], r["outcome"], r["key_id"]) for r in lines] == [
        ("POST", "sandboxes", "unauthorized", None), ("POST", "sandboxes", "ok", key_id(key)),
        ("POST", "exec", "ok", key_id(key)), ("DELETE", sb.id, "ok", key_id(key))]


def test_the_reward_client_sends_its_key_and_names_the_fix_when_refused(tmp_path):
    from agentrl_cli.runtime.reward.client import HttpRewardClient, RewardRequestError
    from agentrl_cli.runtime.reward.models import ScoreRequest
    from agentrl_cli.runtime.reward.scorer import Scorer
    from agentrl_cli.runtime.reward.service import create_app

    scorer = Scorer()
    server = ServerThread(create_app(scorer, keys="reward-key-0123456789"), name="reward service").start()
    req = ScoreRequest.model_validate(score_request())
    try:
        assert HttpRewardClient(server.url, api_key="reward-key-0123456789").score(req).trajectory_id == "auth-probe"
        with pytest.raises(RewardRequestError, match="reward.api_key"):
            HttpRewardClient(server.url).score(req)
    finally:
        server.stop()
        scorer.close()


def test_serve_inference_takes_its_key_from_a_file_not_argv_and_audits_weight_updates(tmp_path, random_model_dir):
    key_file, audit_path, port = tmp_path / "inference.key", tmp_path / "audit.jsonl", free_port()
    rotate(key_file)
    [key] = read_key_file(key_file)
    env = {**os.environ, "AGENTRL_INFERENCE__API_KEY_FILE": str(key_file), "AGENTRL_OBSERVE__AUDIT_LOG": str(audit_path)}
    log = open(tmp_path / "server.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "agentrl_cli", "serve", "inference", "--model", str(random_model_dir),
                             "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, (tmp_path / "server.log").read_text()
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            assert time.monotonic() < deadline, "server not healthy within 180 s"
            time.sleep(0.2)  # poll interval
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().decode()
        assert key not in cmdline and "--api-key" not in cmdline
        body = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1}}
        assert httpx.post(url + "/generate", json=body, timeout=60).status_code == 401
        rotate(key_file)
        for k in read_key_file(key_file):  # the new key and the old one
            assert httpx.post(url + "/generate", json=body, headers={"Authorization": f"Bearer {k}"}, timeout=60).status_code == 200
        update = httpx.post(url + "/update_weight_version", json={"new_version": "7"}, timeout=60,
                            headers={"Authorization": f"Bearer {key}"})
        assert update.status_code == 200
        wrong = httpx.post(url + "/update_weight_version", json={"new_version": "8"}, timeout=60,
                           headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.json() == {"error": "Unauthorized"}  # SGLang's answer
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
    lines = [json.loads(line) for line in audit_path.read_text().splitlines()]
    assert [(r["endpoint"], r["outcome"], r["key_id"]) for r in lines if r["endpoint"] == "/update_weight_version"] == [
        ("/update_weight_version", "ok", key_id(key)), ("/update_weight_version", "unauthorized", None)]
    for text in (audit_path.read_text(), (tmp_path / "server.log").read_text()):
        assert not any(k in text for k in read_key_file(key_file))
