"""The call log of real episodes: each built-in harness plays one task of every family through the
rollout's path (the controller, the chat template, real sandboxes and the tool service, the reward
scorer) into a store written by the rollout's writer (`open_writer`: call log on), with the output
clip set low. The model is scripted (`ScriptedClient` generates the scripted solution's tokens: the
random tiny model does not emit tool calls), so what it emitted is known; the test parses the stored
action text itself for the expected names and arguments, and checks each output against the step's
observation (what the tool returned, as the agent was shown it) up to the clip. Then `agentrl data
calls --task T` lists exactly the calls of T's trajectories."""

from __future__ import annotations

import asyncio
import hashlib
import json

import pytest
from transformers import AutoTokenizer

from agentrl_cli.config import load_config
from agentrl_cli.runtime.data.calls import read_calls
from agentrl_cli.runtime.data.writer import open_writer, read_records
from agentrl_cli.runtime.reward.client import LocalRewardClient
from agentrl_cli.runtime.reward.scorer import Scorer
from agentrl_cli.runtime.rollout.buffer import TrajectoryBuffer
from agentrl_cli.runtime.rollout.controller import RolloutController
from agentrl_cli.runtime.rollout.sampler import TaskSampler
from agentrl_cli.envs.sandbox import SandboxSettings
from agentrl_cli.envs.sandbox.provider import DirectProvider
from harnesses.tasks import HARNESS_FAMILIES, load_tasks
from tests.integration.conftest import needs_bwrap
from tests.integration.test_stored_tool_calls import BUILTINS, ScriptedClient, expected_calls

pytestmark = [pytest.mark.integration, needs_bwrap]
CLIP = 48


def play(harness: str, random_model_dir, root) -> tuple:
    tasks = [load_tasks(harness, "train", family)[0] for family in HARNESS_FAMILIES[harness]]
    cfg = load_config(None, ["rollout.concurrency=1", "rollout.group_size=1", "rollout.max_steps_per_trajectory=8",
                             "rollout.buffer_size=16", "inference.max_new_tokens=256", f"data.root={root}",
                             f"data.max_tool_output_bytes={CLIP}"], env={}).config
    tok = AutoTokenizer.from_pretrained(random_model_dir)
    writer = open_writer(cfg.data)
    scorer = Scorer(provider=DirectProvider(SandboxSettings()))
    ctl = RolloutController(cfg, ScriptedClient(tok, tasks), tok, LocalRewardClient(scorer),
                            TaskSampler({harness: tasks}, group_size=1, seed=3), TrajectoryBuffer(16, 2, 1),
                            run_id="calllog", writer=writer)

    async def go():
        await ctl.run(asyncio.Event(), max_groups=len(tasks))
    try:
        asyncio.run(go())
    finally:
        ctl.close()
        writer.close()
        scorer.close()
    return read_records(writer.store), writer.store


def _clipped(text: str) -> str:
    return text.encode()[:CLIP].decode("utf-8", "ignore")


@pytest.mark.parametrize("harness", BUILTINS)
def test_the_call_log_holds_what_the_model_emitted_and_what_the_tools_returned(harness, random_model_dir, tmp_path, cli):
    records, store = play(harness, random_model_dir, tmp_path / "store")
    assert records and all(r.outcome == "success" for r in records), [(r.task_id, r.outcome) for r in records]
    logged = read_calls(store).to_pylist()
    lone = 0
    for record in records:
        for step in record.steps:
            calls = step.tool_calls
            assert [(c.name, json.loads(c.arguments)) for c in calls] == expected_calls(harness, step.action)
            for c in calls:
                assert c.output is not None and len(c.output.encode()) <= CLIP and c.output_bytes >= len(c.output.encode())
                assert c.output in step.observation  # a clipped piece of what the agent was shown
            if len(calls) == 1 and "answer recorded" not in step.observation:
                full = step.observation  # a lone call's output is its step's observation, whole
                (c,) = calls
                assert c.output == _clipped(full) and c.output_bytes == len(full.encode())
                assert c.output_sha256 == hashlib.sha256(full.encode()).hexdigest()
                lone += 1
            if harness != "tool_api_like":
                assert all(c.exit_code is not None for c in calls)  # sandboxed calls run commands
        mine = sorted((r["step"], r["call"], r["tool"], r["arguments"], r["output"]) for r in logged
                      if r["trajectory_id"] == record.trajectory_id)
        assert mine == sorted((s.index, i, c.name, c.arguments, c.output) for s in record.steps
                              for i, c in enumerate(s.tool_calls))
    assert lone >= 1 and len(logged) == sum(r.tool_calls for r in records) >= len(HARNESS_FAMILIES[harness])
    task = records[0].task_id
    result, data = cli.json("data", "calls", "--task", task, "--set", f"data.root={store.root}")
    assert result.exit_code == 0, result.output
    want = sorted((s.index, c.name, c.arguments) for r in records if r.task_id == task for s in r.steps for c in s.tool_calls)
    assert sorted((row["step"], row["tool"], row["arguments"]) for row in data["rows"]) == want and want
    assert {row["harness"] for row in data["rows"]} == {harness}
