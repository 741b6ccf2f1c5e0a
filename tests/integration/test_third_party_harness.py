"""A harness that is not part of agentrl, written against the contract in this file and named by
`module:Class` with its own tasks, passes stage 5's contract checks and trains through stage 8
smoke with no change to agentrl's code. The same harness, told to fail its first environment
creations, shows the retries with backoff and, past them, a masked episode that never leaves its
GRPO group waiting."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from agentrl_cli.config import load_config
from agentrl_cli.run.training_run import TrainingRun
from harnesses.base import Action, Evidence, Observation, TaskSet, TaskSpec, Trajectory
from tests.conftest import free_port

pytestmark = [pytest.mark.integration, pytest.mark.e2e]
NAME = f"{__name__}:EchoHarness"
PATTERN = "(?s).{1,43}"


class EchoHarness:
    """Answer briefly: the whole reply (plain text, over 5 characters) is the answer, and it passes when it is at most 43 characters
    long (about half of a random tiny model's 16-token replies, so rewards vary within a group). No
    sandbox, no tools; graded by the reward service's regex verifier."""

    name = "echo"
    version = "1"

    def __init__(self, fail_resets: int = 0) -> None:
        self.fail_resets, self.task, self.answer = fail_resets, None, None

    @classmethod
    def task_set(cls) -> TaskSet:
        words = ["apple", "river", "stone", "cloud", "ember", "maple", "delta", "frost"]
        tasks = [TaskSpec(task_id=f"echo/{split}/{i}", harness="echo", prompt=f"Say the word {w}, in at most 43 characters.",
                          answer=w, difficulty=1, split=split, meta={"family": "echo", "verify": "regex", "pattern": PATTERN})
                 for split in ("train", "eval") for i, w in enumerate(words)]
        return TaskSet("echo-1", tuple(tasks))

    def system_prompt(self) -> str:
        return "Reply with the word, briefly."

    def tools(self) -> list[dict]:
        return []

    def reset(self, task_spec: TaskSpec) -> Observation:
        if self.fail_resets > 0:
            self.fail_resets -= 1
            raise ConnectionError("environment host refused the episode")
        self.task, self.answer = task_spec, None
        return Observation(text=task_spec.prompt)

    def step(self, action: Action) -> Observation:
        if self.task is None:
            return Observation(text="reset first", status="invalid_action", done=True)
        text = action.text.strip()
        if len(text) <= 5 or "<tool_call>" in text:  # its convention: plain text, more than a word
            return Observation(text="answer in plain text, a few words", status="invalid_action")
        self.answer = action.text.strip()
        return Observation(text="recorded", done=True)

    def evidence(self, trajectory: Trajectory) -> Evidence:
        return Evidence(final_answer=self.answer)

    def compute_reward(self, trajectory: Trajectory) -> float:
        return float(self.answer is not None and re.fullmatch(PATTERN, self.answer) is not None)

    def full_reset(self) -> None:
        self.task, self.answer = None, None

    def close(self) -> None:
        self.full_reset()


def test_a_third_party_harness_passes_stage_5_contract_checks(cli, write_yaml, quick_sets):
    write_yaml(f"harnesses:\n  - name: '{NAME}'\n")
    result, data = cli.json("stage", "run", "5", *quick_sets, "--set", "stages.sandbox_concurrency=2")
    checks = {c["name"]: c for c in data["reports"][0]["checks"]}
    assert result.exit_code == 0, [(n, c["detail"][:200]) for n, c in checks.items() if c["status"] == "fail"]
    for check in ("loads", "clean reset", "invalid actions", "one episode through the training path"):
        assert checks[f"harness {NAME}: {check}"]["status"] == "pass"
    assert checks[f"harness {NAME}: scripted episodes"]["status"] == "skip"


def test_a_third_party_harness_trains_through_stage_8_smoke(cli, write_yaml, quick_sets):
    write_yaml(f"harnesses:\n  - name: '{NAME}'\n")
    result, data = cli.json("stage", "run", "8", *quick_sets, "--set", "rollout.max_steps_per_trajectory=1")
    report = data["reports"][-1]
    failing = [(c["name"], c["detail"][:300]) for c in report["checks"] if c["status"] == "fail"]
    assert result.exit_code == 0 and report["status"] == "pass", failing


def test_failed_environment_creations_are_retried_then_masked_without_stalling_the_group(tmp_path, random_model_dir):
    sets = {"inference.port": free_port(), "inference.max_new_tokens": 8, "rollout.concurrency": 2, "rollout.group_size": 2,
            "rollout.max_steps_per_trajectory": 1, "rollout.mode": "sync", "training.micro_batch_size": 4,
            "training.checkpoint_interval_steps": 100, "data.root": str(tmp_path / "store"), "model.path": str(random_model_dir),
            "rollout.env_create_retries": 1, "rollout.env_create_backoff_s": 0.01}
    harnesses = json.dumps([{"name": NAME, "options": {"fail_resets": 3}}])
    cfg = load_config(None, [f"{k}={v}" for k, v in sets.items()] + [f"harnesses={harnesses}"], env={}).config

    async def go():
        run = TrainingRun(cfg, tmp_path / "run", random_model_dir, run_id="flaky")
        try:
            await run.start()
            return await run.run(1)
        finally:
            await run.close()
    summary = asyncio.run(go())  # returns: no group waits forever on an episode that never started
    c = summary.counters
    # each instance fails its first 3 creations: with one retry, its first episode is masked, the next succeeds
    assert c["env_create_failures"] >= 3 and c["env_create_retries"] >= 1
    assert c["termination_infra_error"] >= 1 and summary.steps == 1
    row = summary.metrics[-1]
    assert row["env/echo/create_failures/ConnectionError"] >= 3 and row["reward/masked"] >= 1
