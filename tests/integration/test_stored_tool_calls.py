"""Stored tool calls carry the tool's name and parsed arguments, for every built-in harness. Each
harness plays one task of every family through the real rollout path (the controller, the chat
template, real sandboxes and the tool service, the reward scorer, the trajectory store), with an
inference client that "generates" the scripted solution's tokens. The expected calls come from
parsing the stored action text here, independently of the harnesses: the JSON of each
`<tool_call>` block and the body of each ```python fence."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from transformers import AutoTokenizer

from agentrl_cli.config import load_config
from agentrl_cli.runtime.data.local_store import LocalStore
from agentrl_cli.runtime.data.writer import TrajectoryWriter, read_records
from agentrl_cli.engines.inference.client import Generation
from agentrl_cli.model.chat import chat_format
from agentrl_cli.runtime.reward.client import LocalRewardClient
from agentrl_cli.runtime.reward.scorer import Scorer
from agentrl_cli.runtime.rollout.buffer import TrajectoryBuffer
from agentrl_cli.runtime.rollout.controller import RolloutController
from agentrl_cli.runtime.rollout.sampler import TaskSampler
from agentrl_cli.envs.sandbox import SandboxSettings
from agentrl_cli.envs.sandbox.provider import DirectProvider
from harnesses.oracle import oracle_action
from harnesses.tasks import HARNESS_FAMILIES, load_tasks
from tests.integration.conftest import needs_bwrap

pytestmark = [pytest.mark.integration, needs_bwrap]
BUILTINS = ("terminal_like", "code_sandbox_like", "tool_api_like")


class ScriptedClient:
    """An inference client whose every answer is the next scripted action of the episode being played
    (one episode at a time: an input that does not extend the previous one starts a new episode)."""

    def __init__(self, tokenizer, tasks) -> None:
        self.tok, self.tasks = tokenizer, tasks
        self.end = chat_format(tokenizer).end_of_turn
        self.previous: list[int] = []
        self.turn = 0
        self.in_flight: dict = {}

    async def generate(self, input_ids, sampling) -> Generation:
        ids = list(input_ids)
        self.turn = self.turn + 1 if self.previous and ids[:len(self.previous)] == self.previous else 0
        self.previous = ids
        text = self.tok.decode(ids, skip_special_tokens=False)
        task = next(t for t in self.tasks if t.prompt in text)
        out = self.tok.encode(oracle_action(task, self.turn) or "ANSWER: 0", add_special_tokens=False) + [self.end]
        return Generation(output_ids=out, output_logprobs=[-0.5] * len(out), finish_reason="stop", weight_version="1",
                          latency=0.0, server="scripted")

    async def close(self) -> None:
        return None


def expected_calls(harness: str, action: str) -> list[tuple[str, dict]]:
    calls = []
    for block in re.findall(r"<tool_call>(.*?)</tool_call>", action, re.S):
        data = json.loads(block)
        if not (harness == "tool_api_like" and data["name"] == "final_answer"):  # ends the episode; no API call
            calls.append((data["name"], data["arguments"]))
    if harness == "code_sandbox_like":
        calls += [("run_python", {"code": body}) for body in re.findall(r"```python\n(.*?)```", action, re.S)]
    return calls


def play_all(harness: str, random_model_dir, tmp_path) -> list:
    tasks = [load_tasks(harness, "train", family)[0] for family in HARNESS_FAMILIES[harness]]
    cfg = load_config(None, ["rollout.concurrency=1", "rollout.group_size=1", "rollout.max_steps_per_trajectory=8",
                             "rollout.buffer_size=16", "inference.max_new_tokens=256"], env={}).config
    tok = AutoTokenizer.from_pretrained(random_model_dir)
    sampler = TaskSampler({harness: tasks}, group_size=1, seed=3)
    writer = TrajectoryWriter(LocalStore(tmp_path / "store"))
    scorer = Scorer(provider=DirectProvider(SandboxSettings()))  # hidden tests run in sandboxes of their own
    ctl = RolloutController(cfg, ScriptedClient(tok, tasks), tok, LocalRewardClient(scorer),
                            sampler, TrajectoryBuffer(16, 2, 1), run_id="calls", writer=writer)

    async def go():
        await ctl.run(asyncio.Event(), max_groups=len(tasks))
    try:
        asyncio.run(go())
    finally:
        ctl.close()
        writer.close()
        scorer.close()
    return read_records(writer.store)


@pytest.mark.parametrize("harness", BUILTINS)
def test_stored_tool_calls_carry_the_tools_name_and_parsed_arguments(harness, random_model_dir, tmp_path):
    records = play_all(harness, random_model_dir, tmp_path)
    assert records and {r.harness for r in records} == {harness}
    seen = 0
    for record in records:
        assert record.outcome == "success", (record.task_id, [s.observation for s in record.steps])
        for step in record.steps:
            stored = [(c.name, json.loads(c.arguments)) for c in step.tool_calls]
            assert stored == expected_calls(harness, step.action), (record.task_id, step.index, step.action)
            assert all(c.status in ("ok", "empty") and c.latency_ms >= 0 for c in step.tool_calls)
            seen += len(stored)
        assert record.tool_calls == sum(len(s.tool_calls) for s in record.steps) >= 1
        assert len(record.token_ids) == len(record.loss_mask) == len(record.logprobs) > 0
    assert seen >= len(HARNESS_FAMILIES[harness])
