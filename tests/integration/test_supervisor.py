"""The run's supervisor on a real run (embedded server processes on 127.0.0.1, rollout, reward,
store, a plain-torch trainer) with a random tiny model:

- an inference server SIGKILLed mid-run leaves the rotation at once, is restarted on its port,
  re-synced to the run's weights and verified, and serves again only then: its weight_version, read
  from the server itself, equals the run's before it answers a request;
- a component that dies on every start stops the run after `supervisor.max_restarts` restarts with
  `ComponentFailed` naming it, with its last log lines and the fix.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import httpx
import pytest

from agentrl_cli.config import load_config
from agentrl_cli.runtime.observe import keys
from agentrl_cli.run.training_run import training
from agentrl_cli.run.supervise import ComponentFailed, ProcessComponent
from tests.conftest import free_port, free_ports
from tests.integration.conftest import needs_bwrap

pytestmark = [pytest.mark.integration, needs_bwrap]
PLAIN = "tests.integration.test_plugin_recipes:PlainTorchBackend"


def config(tmp_path: Path, model: Path, **extra):
    sets = {"inference.port": free_ports(2), "inference.replicas": 2, "inference.max_new_tokens": 8,
            "inference.startup_timeout_s": 120, "rollout.concurrency": 8, "rollout.group_size": 2,
            "rollout.max_steps_per_trajectory": 1, "rollout.weight_sync_interval_steps": 1, "rollout.mode": "async",
            "rollout.max_staleness": 1, "training.micro_batch_size": 4, "training.checkpoint_interval_steps": 100,
            "data.root": str(tmp_path / "store"), "model.path": str(model), "training.backend": PLAIN,
            "observe.health_interval_s": 0.2, "supervisor.backoff_s": 0.05, **extra}
    return load_config(None, [f"{k}={v}" for k, v in sets.items()] + ['harnesses=[{"name": "tool_api_like"}]'], env={}).config


async def until(condition, what: str, deadline_s: float = 120.0) -> None:
    end = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {deadline_s} s waiting for {what}")
        await asyncio.sleep(0.02)


def events(run, name: str, kind: str | None = None) -> list[dict]:
    return [e for e in run.supervisor.events if e["component"] == name and (kind is None or e["event"] == kind)]


def test_a_sigkilled_server_is_restarted_resynced_and_serves_again_only_at_the_runs_weights(tmp_path, random_model_dir):
    cfg = config(tmp_path, random_model_dir)
    served: list[tuple[str, str, float]] = []  # (server, weight version, when) of every generation the rollout got

    async def go():
        async with training(cfg, tmp_path / "run", random_model_dir, run_id="sv") as run:
            generate = run.client.generate

            async def recorded(*args, **kwargs):
                gen = await generate(*args, **kwargs)
                served.append((gen.server, gen.weight_version, time.monotonic()))
                return gen
            run.client.generate = recorded
            victim = run.servers[0]
            url = victim.url

            async def at_down():
                await until(lambda: events(run, "inference-0", "down"), "the supervisor to see it down")
                return time.monotonic(), url in run.client.urls

            def kill(row: dict) -> None:
                # mid-run: the rollout goes on while the server is down. At step 2, so version 1 is published
                # to both servers first: killed at step 1, the server died while version 1's overlapped
                # publish was in flight and came back to the launch weights, then the run's last published
                # version (seen under CI's load)
                if row["step"] == 2:
                    os.killpg(victim.proc.pid, signal.SIGKILL)
            watcher = asyncio.create_task(at_down())
            await run.run(3, on_step=kill)
            down_t, in_rotation_when_down = await watcher
            await until(lambda: events(run, "inference-0", "back"), "the server back")
            back_t = time.monotonic()
            summary = await run.run(5)
            async with httpx.AsyncClient() as http:
                serving_at_end = (await http.get(url + "/get_model_info")).json()["weight_version"]
            return run, url, down_t, back_t, in_rotation_when_down, summary, serving_at_end
    run, url, down_t, back_t, in_rotation_when_down, summary, serving_at_end = asyncio.run(go())
    assert [e["event"] for e in events(run, "inference-0")] == ["down", "restarting", "restarted", "back"]
    assert "exited with code -9" in events(run, "inference-0", "down")[0]["cause"]
    assert not in_rotation_when_down, "a dead server must leave the rotation at once"
    back = events(run, "inference-0", "back")[0]
    # what the restarted server served: nothing while out, then only the run's weights, never its launch weights ("0")
    assert not [s for s in served if s[0] == url and down_t < s[2] < back_t]
    after = [int(v) for server, v, t in served if server == url and t > back_t]
    assert after, "back in rotation, it serves again"
    assert min(after) >= int(back["weight_version"]) >= 1 and back["run_version"] >= int(back["weight_version"])
    assert summary.steps == 5 and serving_at_end == str(run.publisher.last.version) == "5"
    rows = summary.metrics
    assert rows[-1][keys.SUPERVISOR_RESTARTS] == 1 and rows[-1][keys.SUPERVISOR_DOWN] == 1
    assert rows[-1][keys.SUPERVISOR_DOWN_NOW] == 0 and rows[-1][keys.SUPERVISOR_SERVERS] == 2
    assert events(run, "inference-1") == []


def test_a_component_that_dies_on_every_start_stops_the_run_naming_it(tmp_path, random_model_dir):
    cfg = config(tmp_path, random_model_dir, **{"inference.replicas": 1, "supervisor.max_restarts": 2})
    flaky = ProcessComponent("reward-flaky", [sys.executable, "-c", "import sys; print('flaky: cannot open its store', "
                                                                    "file=sys.stderr); sys.exit(3)"],
                             f"http://127.0.0.1:{free_port()}", tmp_path / "logs", kind="reward")
    steps: list[int] = []

    async def go():
        async with training(cfg, tmp_path / "run", random_model_dir, run_id="sv", components=[flaky]) as run:
            with pytest.raises(ComponentFailed) as caught:
                await run.run(50, on_step=lambda row: steps.append(row["step"]))
            return run, caught.value
    run, failed = asyncio.run(go())
    assert [e["event"] for e in events(run, "reward-flaky")] == ["down", "restarting", "restarting", "gave_up"]
    assert "first start failed" in events(run, "reward-flaky", "down")[0]["cause"]
    assert failed.name == "reward-flaky" and "gave up after 2 restart(s)" in failed.cause
    assert "flaky: cannot open its store" in failed.log_tail and "reward.service_url" in failed.hint
    assert len(steps) < 50
