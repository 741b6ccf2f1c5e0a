"""A harness whose every episode plants a memory hog in its sandbox, trained for one step by a real
TrainingRun (tiny random model, real bubblewrap sandboxes with cgroups): each stored trajectory
carries its sandbox's peak memory, at least the hog's; the step's metrics row aggregates it per
harness; `agentrl troubleshoot --run` ranks the sandbox-memory rule with the figure; and the
rendered Prometheus rule for it, evaluated on the run's rows, fires."""

from __future__ import annotations

import asyncio
import json
import shutil

import pytest
import yaml

from agentrl_cli.config import load_config
from agentrl_cli.runtime.data.stores import open_store
from agentrl_cli.runtime.data.writer import read_records
from agentrl_cli.acceptance import alerts
from agentrl_cli.runtime.observe import keys
from agentrl_cli.acceptance.run_meta import create_run
from agentrl_cli.run.training_run import TrainingRun
from agentrl_cli.envs.sandbox.cgroups import cgroup_support
from agentrl_cli.acceptance.troubleshoot.diagnose import diagnose
from agentrl_cli.acceptance.verify.judge import achievable_max_reward
from harnesses.base import Action, Evidence, Observation, TaskSet, TaskSpec, Trajectory
from harnesses.sandboxed import SandboxHarness
from tests.conftest import free_port

pytestmark = [pytest.mark.integration]
NAME = f"{__name__}:HogHarness"
HOG_MB = 200
HOG = f"python3 -c \"x = b'x' * ({HOG_MB} * 1024 * 1024); print(len(x))\""


class HogHarness(SandboxHarness):
    """Every step runs a command that holds HOG_MB MiB in the episode's sandbox, then ends the episode."""

    name = "hog"
    version = "1"

    @classmethod
    def task_set(cls) -> TaskSet:
        tasks = [TaskSpec(task_id=f"hog/{split}/{i}", harness="hog", prompt="Say anything.", answer="x", difficulty=1,
                          split=split, meta={"family": "hog", "verify": "regex", "pattern": "(?s).*"})
                 for split in ("train", "eval") for i in range(4)]
        return TaskSet("hog-1", tuple(tasks))

    def system_prompt(self) -> str:
        return "Reply."

    def tools(self) -> list[dict]:
        return []

    def step(self, action: Action) -> Observation:
        result = self.sandbox.exec(HOG, timeout=30)
        self.hog_output = result.output.strip()
        return Observation(text=result.output[:200], status=result.status, done=True, info={"exit_code": result.exit_code})

    def evidence(self, trajectory: Trajectory) -> Evidence:
        return Evidence(final_answer=getattr(self, "hog_output", None))

    def compute_reward(self, trajectory: Trajectory) -> float:
        return 1.0


@pytest.mark.skipif(shutil.which("bwrap") is None or not cgroup_support().startswith("v"),
                    reason="needs bubblewrap and writable cgroups (the figures are read from the sandbox's cgroup)")
def test_a_planted_memory_hog_is_stored_aggregated_diagnosed_and_alerted(tmp_path, random_model_dir):
    sets = {"inference.port": free_port(), "inference.max_new_tokens": 4, "rollout.concurrency": 2, "rollout.group_size": 2,
            "rollout.max_steps_per_trajectory": 1, "rollout.mode": "sync", "training.micro_batch_size": 4,
            "training.checkpoint_interval_steps": 100, "data.root": str(tmp_path / "store"), "model.path": str(random_model_dir),
            "observe.runs_dir": str(tmp_path / "runs"), "sandbox.memory_mb": 512,
            "observe.alert_peak_memory_mb": HOG_MB * 3 // 4}
    overrides = [f"{k}={v}" for k, v in sets.items()] + [f"harnesses={json.dumps([{'name': NAME}])}"]
    loaded = load_config(None, overrides, env={})
    cfg = loaded.config
    run_dir = create_run(loaded, run_id="hog")

    async def go():
        run = TrainingRun(cfg, run_dir.path / "stage8", random_model_dir, run_id="hog")
        try:
            await run.start()
            return await run.run(1)
        finally:
            await run.close()
    summary = asyncio.run(go())
    assert summary.steps == 1

    # stored with each trajectory: the sandbox's peak memory covers the hog, its CPU time is counted
    records = [r for r in read_records(open_store(cfg.data)) if r.run_id == "hog"]
    assert records and all(r.env_resources is not None for r in records)
    for r in records:
        assert r.env_resources["peak_memory_bytes"] >= HOG_MB * keys.MIB, r.env_resources
        assert r.env_resources["cpu_s"] > 0 and r.env_resources["processes"] >= 1 and r.env_resources["open_files"] >= 1

    # aggregated per harness in the step's row
    row = next(r for r in summary.metrics if keys.is_step_row(r))
    assert row[keys.env_resource("hog", "peak_mem_mb_max")] >= HOG_MB
    assert row[keys.env_resource("hog", "cpu_s_mean")] > 0

    # troubleshoot --run: the sandbox-memory entry, with the figure
    findings = diagnose(run_dir, cfg)
    found = next(f for f in findings if f.entry.id == "sandbox-memory-high")
    kind, hit = found.hits[0]
    figure = hit.evidence["alert/firing"]
    assert kind == "alert:AgentrlSandboxMemoryHigh" and figure["rule"] == "AgentrlSandboxMemoryHigh"
    assert figure["value"] >= HOG_MB and figure["labels"] == {"harness": "hog"}
    rows = [json.loads(line) for line in (run_dir.path / "stage8" / "metrics.jsonl").read_text().splitlines() if line.strip()]

    # the rendered rule file: Prometheus's schema, and the memory rule's expression is the rule object's,
    # which fires on the run's rows
    rendered = yaml.safe_load(alerts.render(cfg.observe, achievable_max_reward(cfg.reward.weights)))
    (group,) = rendered["groups"]
    assert set(group) == {"name", "rules"}
    for rule in group["rules"]:
        assert set(rule) == {"alert", "expr", "for", "labels", "annotations"} and rule["expr"] and rule["alert"]
    by_name = {r.alert: r for r in alerts.rules(cfg.observe, achievable_max_reward(cfg.reward.weights))}
    memory = by_name["AgentrlSandboxMemoryHigh"]
    window = alerts.window_s(cfg.observe)
    expr = next(r["expr"] for r in group["rules"] if r["alert"] == memory.alert)
    assert expr == memory.promql(window) == f"max_over_time(agentrl_env_peak_mem_mb_max[15m]) > {HOG_MB * 3 // 4}"
    fired = memory.evaluate(rows, window)
    assert list(fired) == [(("harness", "hog"),)] and fired[(("harness", "hog"),)] >= HOG_MB


@pytest.mark.skipif(shutil.which("bwrap") is None or not cgroup_support().startswith("v"),
                    reason="needs bubblewrap and writable cgroups (the figures are read from the sandbox's cgroup)")
def test_a_sandbox_reports_what_it_used_until_it_is_closed():
    from agentrl_cli.envs.sandbox import Sandbox

    with Sandbox() as sb:
        before = sb.resources()
        assert before["peak_memory_bytes"] < HOG_MB * keys.MIB and before["processes"] >= 1 and before["open_files"] >= 3
        held = sb.exec(f"{HOG} && sleep 0", timeout=30)
        assert held.exit_code == 0 and held.output.strip() == str(HOG_MB * 1024 * 1024)
        after = sb.resources()
        assert after["peak_memory_bytes"] >= HOG_MB * keys.MIB
        assert after["cpu_s"] > before["cpu_s"]
    assert sb.resources() is None  # the groups are gone with the sandbox


@pytest.mark.skipif(shutil.which("bwrap") is None or not cgroup_support().startswith("v"),
                    reason="needs bubblewrap and writable cgroups (the figures are read from the sandbox's cgroup)")
def test_the_sandbox_service_reports_an_episodes_use_before_destroying_it(sandbox_root):
    from agentrl_cli.envs.sandbox import SandboxPool, SandboxSettings
    from agentrl_cli.envs.sandbox.remote import RemoteProvider
    from agentrl_cli.envs.sandbox.service import create_app
    from agentrl_cli.core.serving import ServerThread

    pool = SandboxPool(SandboxSettings(root_dir=sandbox_root), size=1, max_concurrency=2)
    server = ServerThread(create_app(pool), name="sandbox service").start()
    provider = RemoteProvider(server.url)
    try:
        h = HogHarness(sandboxes=provider)
        h.reset(HogHarness.task_set().tasks[0])
        assert h.step(Action(text="go")).done
        h.end_episode()  # reads the figures over HTTP, then deletes the sandbox
        assert h.episode_resources["peak_memory_bytes"] >= HOG_MB * keys.MIB and h.episode_resources["cpu_s"] > 0
        h.close()
    finally:
        provider.close()
        server.stop()
        pool.close()
