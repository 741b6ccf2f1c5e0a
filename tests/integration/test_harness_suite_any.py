"""The harness contract suite runs on any harness named with `--harness module:Class`: here on one
defined in this file (with scripted solutions and a wrong answer, so every check runs) and on the
third-party echo harness (no scripted solutions: those checks are skipped, with the reason)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harnesses.base import Action, Evidence, Observation, TaskSet, TaskSpec, ToolCallResult, Trajectory
from harnesses.parsing import action_calls, parse_answer, tool_call
from tests.integration.conftest import needs_bwrap

pytestmark = [pytest.mark.integration, needs_bwrap]
ROOT = Path(__file__).resolve().parents[2]
SUITE = "tests/integration/test_harness_contract.py"


class SpellHarness:
    """Reverse a word. One tool, `spell(word)`, lists its letters; the episode ends with a line
    `ANSWER: <reversed word>`. Written only from the contract in harnesses/base.py."""

    name = "spell"
    version = "1"

    def __init__(self) -> None:
        self.task: TaskSpec | None = None

    @classmethod
    def task_set(cls) -> TaskSet:
        words = ("lantern", "meadow", "copper", "willow")
        return TaskSet("spell-1", tuple(
            TaskSpec(task_id=f"spell/{split}/{i}", harness="spell", prompt=f"Reverse the word {w}.", answer=w[::-1],
                     difficulty=1, split=split, meta={"family": "reverse", "verify": "answer"})
            for split in ("train", "eval") for i, w in enumerate(words)))

    @classmethod
    def scripted_action(cls, task: TaskSpec, turn: int) -> str | None:
        word = task.prompt.rsplit(" ", 1)[-1].rstrip(".")
        return {0: tool_call("spell", word=word), 1: f"ANSWER: {task.answer}"}.get(turn)

    @classmethod
    def wrong_action(cls, task: TaskSpec) -> str:
        return "ANSWER: backwards"

    def system_prompt(self) -> str:
        return "Reverse the word you are given. Call spell to see its letters; end with ANSWER: <word>."

    def tools(self) -> list[dict]:
        return [{"type": "function", "function": {"name": "spell", "description": "The letters of a word, in order.",
                                                  "parameters": {"type": "object", "properties": {"word": {"type": "string"}},
                                                                 "required": ["word"]}}}]

    def reset(self, task_spec: TaskSpec) -> Observation:
        self.task = task_spec
        return Observation(text=task_spec.prompt)

    def step(self, action: Action) -> Observation:
        if self.task is None:
            return Observation(text="reset first", status="invalid_action", done=True)
        calls, errors = action_calls(action)
        if parse_answer(action.text) is not None and not calls:
            return Observation(text="answer recorded", done=True)
        if not calls:
            return Observation(text="invalid action: " + ("; ".join(errors) or "call spell or answer"), status="invalid_action")
        results = []
        for call in calls:
            word = call.arguments.get("word")
            ok = call.name == "spell" and isinstance(word, str)
            out = " ".join(word) if ok else f"unknown tool or bad arguments: {call.name}"
            results.append(ToolCallResult(call.name, dict(call.arguments), "ok" if ok else "invalid_action", output=out))
        status = "ok" if all(r.status == "ok" for r in results) else "invalid_action"
        return Observation(text="\n".join(r.output for r in results), status=status, calls=results)

    def compute_reward(self, trajectory: Trajectory) -> float:
        answers = [a for a in (parse_answer(x.text) for x in trajectory.actions) if a is not None]
        return float(bool(answers) and answers[-1] == trajectory.task.answer)

    def evidence(self, trajectory: Trajectory) -> Evidence:
        answers = [a for a in (parse_answer(x.text) for x in trajectory.actions) if a is not None]
        return Evidence(final_answer=answers[-1] if answers else None)

    def close(self) -> None:
        self.task = None

    def full_reset(self) -> None:
        self.task = None


def run_suite(*harnesses: str) -> subprocess.CompletedProcess:
    args = [a for h in harnesses for a in ("--harness", h)]
    return subprocess.run([sys.executable, "-m", "pytest", SUITE, *args, "-q", "-rs", "-p", "no:cacheprovider"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_the_suite_passes_for_a_harness_defined_in_a_test_module():
    done = run_suite(f"{__name__}:SpellHarness")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout, done.stdout[-2000:]
    assert "terminal_like" not in done.stdout  # only the harness named


def test_the_suite_skips_scripted_checks_for_a_harness_without_scripted_solutions():
    done = run_suite("tests.integration.test_third_party_harness:EchoHarness")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "has no scripted solutions" in done.stdout and "names no wrong answer" in done.stdout, done.stdout[-2000:]
