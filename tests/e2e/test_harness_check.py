"""`agentrl harness check`: a harness is checked against the contract without a model; the defaults
agentrl applies are listed; one episode is played (scripted where the harness ships solutions); a
harness missing a required member fails naming it."""

from __future__ import annotations

import shutil

import pytest

from harnesses.base import Observation

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")]


class SeedOnly:
    name, version = "seed_only", "0.1"

    def reset(self, task):
        return Observation(text=task.prompt)

    def step(self, action):
        return Observation(text="noted", done=True)

    def compute_reward(self, trajectory) -> float:
        return 0.5

    def close(self):
        pass


class NoStep:
    name, version = "no_step", "0.1"

    def reset(self, task):
        return Observation(text=task.prompt)

    def close(self):
        pass


def test_a_built_in_harness_passes_with_its_scripted_episode(cli):
    result, data = cli.json("harness", "check", "terminal_like")
    checks = {c["name"]: c for c in data["checks"]}
    assert result.exit_code == 0 and data["status"] == "pass"
    assert checks["one episode"]["measured"]["policy"] == "scripted" and checks["one episode"]["measured"]["reward"] == 1.0


def test_a_seed_contract_harness_shows_the_defaults_applied(cli, write_yaml, tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"task_id": "a", "prompt": "hi", "answer": "x", "split": "train"}\n')
    write_yaml(f"harnesses:\n  - name: '{__name__}:SeedOnly'\n    tasks: '{tasks}'\n    reward: harness\n")
    result, data = cli.json("harness", "check", f"{__name__}:SeedOnly")
    checks = {c["name"]: c for c in data["checks"]}
    assert result.exit_code == 0, checks
    assert set(checks["defaults applied"]["measured"]) == {"system_prompt", "tools", "evidence", "full_reset", "task_set",
                                                           "end_episode"}
    assert checks["reward source"]["measured"] == "harness"
    assert checks["one episode"]["measured"]["reward"] == 0.5 and checks["one episode"]["measured"]["policy"] == "plain actions"


def test_a_harness_missing_step_fails_naming_it(cli):
    result, data = cli.json("harness", "check", f"{__name__}:NoStep")
    assert result.exit_code == 1 and data["checks"][0]["detail"] == "missing step"
