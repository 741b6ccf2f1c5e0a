"""The contract suite is one entrance exam for a plug-in whose tasks come from a file: run with
`--harness-config PLATFORM_YAML` it configures the harness from that config's `harnesses[]` entry
(tasks file, options), as `agentrl harness check NAME --config` does, and passes it; without the
entry it fails, saying the harness has no tasks. The suite runs for real: pytest in a subprocess,
started in a directory holding the plug-in, its tasks file and its config (relative paths)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import needs_bwrap

pytestmark = [pytest.mark.integration, needs_bwrap]

SUITE = Path(__file__).with_name("test_harness_contract.py")
TARGET = "plug_echo:Echo"

PLUGIN = '''
from harnesses.base import Observation


class Echo:
    """Reply `ANSWER: <the task's answer>`. No task_set(): its tasks come from harnesses[].tasks."""

    name, version = "echo", "0.1"

    def __init__(self):
        self.task = None

    def reset(self, task):
        self.task = task
        return Observation(text=task.prompt)

    def step(self, action):
        if self.task is None or not action.text.strip().startswith("ANSWER:"):
            return Observation(text="reply ANSWER: <answer>", status="invalid_action")
        return Observation(text="noted", done=True)

    def compute_reward(self, trajectory):
        given = [a.text.strip().removeprefix("ANSWER:").strip() for a in trajectory.actions
                 if a.text.strip().startswith("ANSWER:")]
        return float(bool(given) and given[-1] == str(trajectory.task.answer))

    @staticmethod
    def scripted_action(task, turn):
        return f"ANSWER: {task.answer}" if turn == 0 else None

    @staticmethod
    def wrong_action(task):
        return f"ANSWER: not {task.answer}"

    def close(self):
        self.task = None
'''

TASKS = ('{"task_id": "t1", "prompt": "say 4", "answer": "4", "split": "train"}\n'
         '{"task_id": "e1", "prompt": "say 7", "answer": "7", "split": "eval"}\n')


@pytest.fixture
def plugin_dir(tmp_path) -> Path:
    (tmp_path / "plug_echo.py").write_text(PLUGIN)
    (tmp_path / "tasks.jsonl").write_text(TASKS)
    (tmp_path / "plug.yaml").write_text(f"harnesses:\n  - name: '{TARGET}'\n    tasks: tasks.jsonl\n    reward: harness\n")
    (tmp_path / "other.yaml").write_text("harnesses:\n  - name: terminal_like\n")
    return tmp_path


def contract_suite(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTRL_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(cwd), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "pytest", str(SUITE), "--harness", TARGET, *args,
                           "-p", "no:cacheprovider", "-q", "-rfE", "--no-header"],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_with_its_config_entry_the_plugin_passes_the_contract(plugin_dir):
    proc = contract_suite(plugin_dir, "--harness-config", "plug.yaml")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    summary = proc.stdout.strip().splitlines()[-1]
    assert "failed" not in summary and "skipped" not in summary and "error" not in summary, summary
    assert int(summary.split(" passed")[0].split()[-1]) >= 10, summary  # every per-harness check ran


def test_without_its_config_entry_the_plugin_fails_for_want_of_tasks(plugin_dir):
    proc = contract_suite(plugin_dir)
    assert proc.returncode == 1, proc.stdout[-4000:]
    assert f"harness '{TARGET}' has no tasks" in proc.stdout
    failed = [line for line in proc.stdout.splitlines() if line.startswith("FAILED ")]
    assert any("test_scripted_solution_of_every_family_earns_full_reward" in line for line in failed), failed


def test_a_config_without_an_entry_for_the_harness_is_a_usage_error(plugin_dir):
    proc = contract_suite(plugin_dir, "--harness-config", "other.yaml")
    assert proc.returncode != 0
    assert f"has no harnesses[] entry named {TARGET}" in proc.stdout + proc.stderr
