"""Verify layer 1, connectivity: every configured component reachable and healthy, each its own check.

Inference servers (health and one generation; the embedded server is started for the probe when the
config names no running servers), the reward service (health and one score; in-process scoring when
none is configured), sandboxes (create, execute, reclaim, nothing left behind), the trajectory store
(write, read, delete a probe object) and the state store. Every probe runs under a deadline: a
component that is down or hangs fails with its address and the fix, never a hang.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import httpx

from agentrl_cli.core.httpclient import http_client
from agentrl_cli.core.outcomes import RewardStatus
from agentrl_cli.core.report import Check, CheckStatus

PROBE_DEADLINE_S = 20.0
HTTP_TIMEOUT_S = 5.0


class Deadline(Exception):
    pass


def within(seconds: float, fn: Callable[[], Any]) -> Any:
    """fn() in a daemon thread; Deadline when it has not returned within `seconds` (the thread is
    left to finish on its own: a hung probe must not hang verify)."""
    box: dict = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the caller
            box["error"] = exc

    t = threading.Thread(target=target, daemon=True, name="verify-probe")
    t.start()
    t.join(seconds)
    if t.is_alive():
        raise Deadline(f"no answer within {seconds:g} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _http_probe(name: str, url: str, fix: str, steps: list[tuple[str, str, dict | None]], key=None) -> Check:
    """GET/POST each (method, path, body) in turn, with the service's bearer key `key` (its config
    `api_key`) when it has one; the first failure fails the check with the address."""
    from agentrl_cli.core.security.keys import client_key

    t0 = time.perf_counter()
    token = client_key(key)
    try:
        with http_client(timeout=HTTP_TIMEOUT_S, headers={"Authorization": f"Bearer {token}"} if token else None) as client:
            for method, path, body in steps:
                r = client.request(method, url.rstrip("/") + path, json=body, timeout=HTTP_TIMEOUT_S * (6 if body else 1))
                if r.status_code != 200:
                    return Check(name, CheckStatus.FAIL, {"address": url, "path": path, "status": r.status_code}, "HTTP 200",
                                 f"{url}{path} answered {r.status_code}: {r.text[:200]}", fix)
    except httpx.HTTPError as exc:
        return Check(name, CheckStatus.FAIL, {"address": url, "error": _why(exc)}, "reachable and healthy",
                     f"{url} is unreachable: {_why(exc)}", fix)
    return Check(name, CheckStatus.PASS, {"address": url, "seconds": round(time.perf_counter() - t0, 3)}, "reachable and healthy")


def inference_checks(cfg, run_dir: Path) -> list[Check]:
    urls = cfg.inference.urls
    fix = ("start the inference servers (`agentrl serve inference`) or correct inference.urls; "
           "`agentrl stage run 4` checks a server in depth")
    from agentrl_cli.engines.generation import SamplingParams
    from agentrl_cli.engines.registry import engine_for

    engine = engine_for(cfg)  # its health and generate routes, its request
    steps = [("GET", engine.routes.health, None),
             ("POST", engine.routes.generate, engine.generate_body([1, 2, 3], SamplingParams(max_new_tokens=2, temperature=0.0)))]
    if urls:
        routers = [cfg.inference.router_url] if cfg.inference.router_url else []
        return [_http_probe(f"inference {'router' if u in routers else 'server'} {u}", u, fix, steps, cfg.inference.api_key)
                for u in [*urls, *routers]]
    name = "inference server (embedded, started for the probe)"

    def probe() -> Check:
        from agentrl_cli.engines.inference.launcher import launch
        from agentrl_cli.model.resolve import resolve_model_path

        path = resolve_model_path(cfg.model.path, cfg.model.cache_dir)
        servers, started = launch(cfg, str(path), run_dir / "logs" / "verify")
        try:
            checks = [_http_probe(name, u, fix, steps, cfg.inference.api_key) for u in started]
        finally:
            for s in servers:
                s.stop()
        bad = [c for c in checks if c.status != CheckStatus.PASS]
        return bad[0] if bad else Check(name, CheckStatus.PASS, {"addresses": started}, "starts, healthy, generates")

    deadline = min(cfg.inference.startup_timeout_s, 240.0) + 30.0
    return [_deadlined(name, deadline, probe, f"{cfg.inference.host}:{cfg.inference.port}",
                       "see runs/<run_id>/logs/verify for the server log; `agentrl stage run 4` checks it in depth")]


def reward_check(cfg) -> Check:
    from harnesses.canaries import canary_tasks

    task = next(t for h in ("terminal_like", "tool_api_like") for t in canary_tasks(h) if t.meta.get("verify") == "answer")
    req = {"task": {"task_id": task.task_id, "harness": task.harness, "prompt": task.prompt, "answer": task.answer,
                    "difficulty": task.difficulty, "split": task.split, "meta": task.meta},
           "trajectory_id": f"verify-probe-{uuid.uuid4().hex[:8]}", "steps": [{"action": "probe"}], "final_answer": "0"}
    url = cfg.reward.service_url
    if url:
        return _http_probe(f"reward service {url}", url,
                           "start it (`agentrl serve reward`) or correct reward.service_url; unset it to score in-process",
                           [("GET", "/health", None), ("POST", "/score", req)], cfg.reward.api_key)
    name = "reward (in-process scorer)"

    def probe() -> Check:
        from agentrl_cli.runtime.reward.client import reward_client
        from agentrl_cli.runtime.reward.models import ScoreRequest

        client = reward_client(cfg)
        try:
            result = client.score(ScoreRequest.model_validate(req))
        finally:
            client.close()
        return Check.judge(name, result.status != RewardStatus.INFRA_ERROR, {"probe": f"a canary task answered {req['final_answer']!r}",
                                                                  "scored_status": result.status, "reward": result.reward},
                           "scores the probe (any status but infra_error)",
                           "see `agentrl stage run 6`", detail=result.detail)
    return _deadlined(name, PROBE_DEADLINE_S, probe, "in-process", "see `agentrl stage run 6`")


def sandbox_check(cfg) -> Check:
    url = cfg.sandbox.service_url
    where = url or f"local {cfg.sandbox.backend} sandboxes under {cfg.sandbox.root_dir}"
    name = f"sandboxes ({where})"
    fix = ("start the sandbox service (`agentrl serve sandbox`) or correct sandbox.service_url" if url else
           "`agentrl sandbox check` names what is missing (bubblewrap, cgroups); `agentrl stage run 5` checks in depth")
    if url:
        health = _http_probe(name, url, fix, [("GET", "/health", None)])
        if health.status != CheckStatus.PASS:
            return health

    def probe() -> Check:
        from agentrl_cli.envs.sandbox.provider import provider_from_config

        provider = provider_from_config(cfg.sandbox)
        sb = provider.acquire()
        try:
            result = sb.exec("echo verify-ok", timeout=10)
            workdir = getattr(sb, "workdir", None)
        finally:
            provider.release(sb)
        left = sorted(sb.processes()) if hasattr(sb, "processes") else []
        if hasattr(sb, "held"):  # a remote sandbox: its work directory is on the service's host, which says
            gone = sb.held() is False
        else:
            gone = workdir is None or not Path(workdir).exists()
        ok = result.exit_code == 0 and "verify-ok" in result.stdout and not left and gone
        return Check.judge(name, ok, {"exit_code": result.exit_code, "processes_left": len(left), "workdir_removed": gone},
                           "create, exec, reclaim; nothing left", fix, detail=result.stderr[-300:])
    return _deadlined(name, PROBE_DEADLINE_S, probe, where, fix)


def store_check(cfg) -> Check:
    where = (f"s3://{cfg.data.s3.bucket}/{cfg.data.s3.prefix} ({cfg.data.s3.endpoint_url or 'AWS'})"
             if cfg.data.store == "s3" else f"local {cfg.data.root}")
    name = f"trajectory store ({where})"
    fix = ("check data.s3 (endpoint, bucket, credentials); `agentrl stage run 7` checks the store in depth"
           if cfg.data.store == "s3" else "check that data.root is writable; `agentrl stage run 7` checks the store in depth")

    def probe() -> Check:
        import tempfile

        from agentrl_cli.runtime.data.stores import open_store

        store = open_store(cfg.data)
        key = f"verify-probe/probe-{uuid.uuid4().hex}.bin"
        payload = uuid.uuid4().bytes * 8
        Path(cfg.data.root).mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=cfg.data.root, delete=False) as f:
            f.write(payload)
        store.publish(Path(f.name), key)
        try:
            same = store.get_bytes(key) == payload
        finally:
            store.delete(key)
        listed = [o for o in store.list("verify-probe/") if o.key == key]
        return Check.judge(name, same and not listed, {"read_back": same, "deleted": not listed}, "write, read, delete a probe", fix)
    return _deadlined(name, PROBE_DEADLINE_S, probe, where, fix)


def state_store_check(cfg) -> Check:
    url = cfg.controlplane.state_store
    try:
        from agentrl_cli.ops.controlplane.store import StateStore
    except ImportError:
        return Check.skipped(f"state store ({url})", "this agentrl version has no control plane, so no state store to reach")
    name = f"state store ({url.split('@')[-1]})"  # never a password in a report
    fix = "start PostgreSQL or correct controlplane.state_store; `agentrl stage run 3` checks the control plane in depth"

    def probe() -> Check:
        store = StateStore(url, connect_timeout_s=5.0)
        try:
            ok = store.query("SELECT 1 AS one")[0]["one"] == 1
            version = store.schema_version()
        finally:
            store.close()
        return Check.judge(name, ok, {"schema_version": version}, "connects and answers a query", fix)
    return _deadlined(name, PROBE_DEADLINE_S, probe, url.split("@")[-1], fix)


def _deadlined(name: str, seconds: float, fn: Callable[[], Check], where: str, fix: str) -> Check:
    """fn's check; an error or no answer within `seconds` fails with the address and the fix."""
    try:
        return within(seconds, fn)
    except Deadline as exc:
        return Check(name, CheckStatus.FAIL, {"address": where, "error": str(exc)}, f"answers within {seconds:g} s",
                     f"{where}: {exc}", fix)
    except Exception as exc:  # noqa: BLE001 - a component that errors is a failing probe, not a crash
        return Check(name, CheckStatus.FAIL, {"address": where, "error": _why(exc)[:300]}, "reachable and healthy",
                     f"{where}: {_why(exc)}", fix)


def checks(ctx) -> list[Check]:
    cfg = ctx.config
    out = inference_checks(cfg, ctx.run.path)
    out += [reward_check(cfg), sandbox_check(cfg), store_check(cfg), state_store_check(cfg)]
    return out
