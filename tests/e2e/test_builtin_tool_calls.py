"""Issue 35's record of tool calls through a stage 8 smoke run of the built-in model (the model that
emits tool calls; the random tiny model of the other tests does not): for terminal_like,
code_sandbox_like and tool_api_like, every stored call's name and arguments equal what the model
emitted (parsed here from each step's action text, independently of agentrl's parser), its output is
a clipped piece of what the tool returned to the agent, and `agentrl data calls --task T` lists
exactly the calls of T's trajectories. It needs the built-in model in model.cache_dir (`agentrl model
build-tiny`, about 10 minutes on 2 cores, or any `agentrl stage run`), so it is deselected by default:

    .venv/bin/python -m pytest -m builtin tests/e2e/test_builtin_tool_calls.py
"""

from __future__ import annotations

import json
import shutil

import pytest

from agentrl_cli.config import load_config
from agentrl_cli.runtime.data.writer import open_writer, read_records
from agentrl_cli.model.resolve import builtin_dir
from agentrl_cli.model.tiny import is_complete
from tests.conftest import free_port
from tests.integration.test_stored_tool_calls import BUILTINS, expected_calls

CLIP = 64
pytestmark = [pytest.mark.builtin, pytest.mark.e2e,
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed"),
              pytest.mark.skipif(not is_complete(builtin_dir(load_config(None, [], env={}).config.model.cache_dir)),
                                 reason="the built-in model is not built (`agentrl model build-tiny`)")]


def test_a_stage8_smoke_stores_the_calls_the_model_emitted_and_what_the_tools_returned(cli, isolated):
    root = isolated / "store"
    harnesses = json.dumps([{"name": h} for h in BUILTINS])
    sets = ["--set", "model.path=builtin:tiny-agent", "--set", f"inference.port={free_port()}", "--set", f"data.root={root}",
            "--set", f"data.max_tool_output_bytes={CLIP}", "--set", f"harnesses={harnesses}"]
    result, data = cli.json("stage", "run", "8", "--phase", "smoke", *sets)
    assert data["reports"][0]["status"] == "pass", [(c["name"], c["detail"]) for c in data["reports"][0]["checks"]]
    cfg = load_config(None, [f"data.root={root}"], env={}).config
    records = read_records(open_writer(cfg.data).store)
    calls_by_harness = {h: 0 for h in BUILTINS}
    for record in records:
        for step in record.steps:
            assert [(c.name, json.loads(c.arguments)) for c in step.tool_calls] == expected_calls(record.harness, step.action)
            for c in step.tool_calls:
                assert len(c.output.encode()) <= CLIP and c.output_bytes >= len(c.output.encode())
                assert c.output in step.observation  # a clipped piece of what the agent was shown
            calls_by_harness[record.harness] += len(step.tool_calls)
    assert {r.harness for r in records} == set(BUILTINS)
    # the harnesses the built-in model was warm-started on make calls; tool_api_like is held out of its
    # warm start and it answers there without a tool call: nothing emitted, nothing stored (checked above)
    assert calls_by_harness["terminal_like"] and calls_by_harness["code_sandbox_like"], calls_by_harness
    record = next(r for r in records if r.tool_calls)
    result, listed = cli.json("data", "calls", "--task", record.task_id, "--set", f"data.root={root}", "--limit", "100000")
    want = sorted((r.trajectory_id, s.index, c.name, c.arguments) for r in records if r.task_id == record.task_id
                  for s in r.steps for c in s.tool_calls)
    assert sorted((row["trajectory_id"], row["step"], row["tool"], row["arguments"]) for row in listed["rows"]) == want
