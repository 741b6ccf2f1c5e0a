"""A sandboxed harness gives its sandbox back as soon as its episode ends (`end_episode`), so the
warm pool refills while the harness waits for its next episode, instead of holding a sandbox that
nobody uses until the next reset."""

from __future__ import annotations

import time

import pytest

from agentrl_cli.envs.sandbox.pool import SandboxPool
from agentrl_cli.envs.sandbox.sandbox import SandboxSettings
from harnesses.base import Action, TaskSpec
from harnesses.terminal_like import TerminalLike
from tests.integration.conftest import needs_bwrap

pytestmark = [pytest.mark.integration, needs_bwrap]


def test_end_episode_returns_the_sandbox_and_the_next_reset_gets_a_fresh_one(sandbox_root):
    task = TaskSpec(task_id="t", harness="terminal_like", prompt="Compute 2 + 3", answer=5, difficulty=1, split="train",
                    meta={"files": {"notes.txt": "hello\n"}})
    with SandboxPool(SandboxSettings(root_dir=sandbox_root), size=1, max_concurrency=4) as pool:
        harness = TerminalLike(sandboxes=pool)
        harness.reset(task)
        first = harness.sandbox.id
        obs = harness.step(Action(text='<tool_call>\n{"name": "run_shell", "arguments": {"command": "echo left > mine.txt"}}\n</tool_call>'))
        assert obs.status in ("ok", "empty")
        harness.end_episode()
        assert harness.sandbox is None and pool.metrics()["in_use"] == 0
        deadline = time.monotonic() + 30
        while pool.counters["destroyed"] < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pool.counters["destroyed"] == 1  # destroyed, never cleaned in place and handed out again
        harness.reset(task)
        assert harness.sandbox.id != first
        out = harness.step(Action(text='<tool_call>\n{"name": "run_shell", "arguments": {"command": "ls"}}\n</tool_call>'))
        assert "notes.txt" in out.text and "mine.txt" not in out.text
        harness.close()
