"""The environments of the TRL comparison (`peer_trl.py`), one definition for both systems: the
terminal_like `arith` prompts and answers, the terminal_like system prompt, and either no
environment work (the episode ends after the first model turn) or a `run_shell` tool that takes
`latency_s` and answers with a fixed text (the episode ends at the first turn without a tool call,
or at the turn limit). agentrl runs them as a harness (`module:Class` in `harnesses[]`); TRL calls
`run_shell` as a tool function and scores with the same `Scorer`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from harnesses.base import Action, Evidence, Observation, Trajectory
from harnesses.parsing import parse_answer, parse_tool_calls
from harnesses.sandboxed import function_tool
from harnesses.terminal_like import SYSTEM_PROMPT

TOOL_DESCRIPTION = "Run a bash command in the working directory; cwd and exported variables persist."
COMMAND_DESCRIPTION = "the bash command"


def tool_result(command: str) -> str:
    """What `run_shell` answers in both systems (the same tokens follow every tool call)."""
    return f"$ {command}\n[exit code 0]"


def write_arith_tasks(path: Path) -> Path:
    """The committed terminal_like `arith` train tasks as a JSONL task file."""
    from harnesses.tasks import load_tasks

    rows = [{"task_id": t.task_id, "prompt": t.prompt, "answer": t.answer, "split": t.split, "difficulty": t.difficulty,
             "meta": t.meta} for t in load_tasks("terminal_like", "train") if t.meta.get("family") == "arith"]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


class PeerArith:
    """No environment work: one model turn, then done. Scored on its `ANSWER:` line."""

    name = "peer_arith"
    version = "1.0"
    with_tools = False

    def __init__(self, latency_s: float = 0.0, **_ignored) -> None:
        self.latency_s = float(latency_s)
        self.task = None

    def system_prompt(self) -> str:
        return SYSTEM_PROMPT

    def tools(self) -> list[dict]:
        if not self.with_tools:
            return []
        return [function_tool("run_shell", TOOL_DESCRIPTION, {"command": {"type": "string", "description": COMMAND_DESCRIPTION}},
                              ["command"])]

    def reset(self, task_spec) -> Observation:
        self.task = task_spec
        return Observation(text=task_spec.prompt, status="ok")

    def step(self, action: Action) -> Observation:
        calls, _errors = parse_tool_calls(action.text)
        commands = [c.arguments.get("command") for c in calls if c.name == "run_shell"]
        commands = [c for c in commands if isinstance(c, str)]
        if not self.with_tools or not commands:
            return Observation(text="submitted", status="ok", done=True)
        out = []
        for command in commands:  # one tool call takes latency_s, as a remote tool's round trip would
            time.sleep(self.latency_s)
            out.append(tool_result(command))
        return Observation(text="\n".join(out), status="ok", info={"calls": [{"tool": "run_shell", "status": "ok"}] * len(out)})

    def evidence(self, trajectory: Trajectory) -> Evidence:
        answers = [a for a in (parse_answer(x.text) for x in trajectory.actions) if a is not None]
        return Evidence(final_answer=answers[-1] if answers else None)

    def compute_reward(self, trajectory: Trajectory) -> float:
        from harnesses.parsing import answers_match

        ev = self.evidence(trajectory)
        return 1.0 if answers_match(ev.final_answer, trajectory.task.answer) else 0.0

    def full_reset(self) -> None:
        self.task = None

    def close(self) -> None:
        self.task = None


class PeerArithTools(PeerArith):
    """Up to `max_steps_per_trajectory` turns: each `run_shell` call takes `latency_s`."""

    name = "peer_arith_tools"
    with_tools = True


def trl_run_shell(latency_s: float):
    """`run_shell` as a TRL tool function (its name, docstring and type hints make the same tool
    spec the harness gives agentrl's chat template)."""
    def run_shell(command: str) -> str:
        """Run a bash command in the working directory; cwd and exported variables persist.

        Args:
            command: the bash command
        """
        time.sleep(latency_s)
        return tool_result(command)
    return run_shell
