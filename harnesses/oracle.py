"""Scripted solutions: for every task family, the actions a competent agent takes, written in each
harness's own convention. They drive the contract tests, the stage-5 checks, replay tests and the
supervised warm start of the built-in model.

`oracle_actions(task, observations)` returns the next action text given the observations so far,
or None when the episode should be over.
"""

from __future__ import annotations

import json

from harnesses.base import TaskSpec

LIST_SOLUTIONS = {
    "sum_even": "def solve(xs):\n    return sum(x for x in xs if x % 2 == 0)\n",
    "count_negative": "def solve(xs):\n    return sum(1 for x in xs if x < 0)\n",
    "max_minus_min": "def solve(xs):\n    return max(xs) - min(xs)\n",
}


def tool_call(name: str, **arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def _terminal(task: TaskSpec, turn: int) -> str | None:
    family = task.meta["family"]
    if turn == 0:
        word = task.prompt.rsplit(" ", 1)[-1].rstrip("?")
        command = {"arith": f"echo $(( {task.meta.get('expression')} ))",
                   "count_matches": f"grep -cw {word} notes.txt",
                   "sum_column": "awk -F, 'NR>1 {s+=$2} END {print s}' inventory.csv",
                   "uppercase_file": "tr a-z A-Z < in.txt > out.txt && cat out.txt"}[family]
        return tool_call("run_shell", command=command)
    if turn == 1:
        return "ANSWER: done" if family == "uppercase_file" else f"ANSWER: {task.answer}"
    return None


def reference_solution(task: TaskSpec) -> str:
    """The gold solution.py of a code task (the reward's null/gold check uses it)."""
    if task.meta["family"] == "arith":
        return f"def solve():\n    return {task.meta['expression']}\n"
    return LIST_SOLUTIONS[task.meta["kind"]]


def _code(task: TaskSpec, turn: int, echo: bool = True, filename: str = "solution.py") -> str | None:
    if turn == 0:
        source = reference_solution(task)
        check = f"\nprint(open({filename!r}).read())" if echo else ""
        return f"```python\nopen({filename!r}, 'w').write({source!r}){check}\n```"
    return "SUBMIT" if turn == 1 else None


def _tool_api(task: TaskSpec, turn: int) -> str | None:
    family = task.meta["family"]
    if family == "arith":
        return {0: tool_call("calculator", expression=task.meta["expression"]),
                1: tool_call("final_answer", answer=task.answer)}.get(turn)
    keys = task.meta["keys"]
    if turn == 0:
        return tool_call("list_keys", table=task.meta["table"])
    if 1 <= turn <= len(keys):
        return tool_call("lookup", table=task.meta["table"], key=keys[turn - 1])
    if turn == len(keys) + 1:
        return tool_call("calculator", expression=" + ".join(str(task.meta["rows"][k]) for k in keys))
    if turn == len(keys) + 2:
        return tool_call("final_answer", answer=task.answer)
    return None


ORACLES = {"terminal_like": _terminal, "code_sandbox_like": _code, "tool_api_like": _tool_api}


def oracle_action(task: TaskSpec, turn: int) -> str | None:
    """The scripted action for `turn` (0-based) of `task`, or None when the episode is over."""
    return ORACLES[task.harness](task, turn)


SLIPS = {"terminal_like": "uppercase_file: the upper-cased text is printed, never written to out.txt",
         "code_sandbox_like": "every family: the code is saved as solve.py, not solution.py"}


def slip_action(task: TaskSpec, turn: int, echo: bool = True) -> str | None:
    """The oracle's solution with one plausible slip that fails the hidden tests (`SLIPS`), where the
    harness has one; otherwise the oracle's action. The warm start's demonstrations carry it at a
    fixed rate (`agentrl_cli/model/demos.py`), for reinforcement learning to find and unlearn."""
    if task.harness == "code_sandbox_like":
        return _code(task, turn, echo=echo, filename="solve.py")
    if task.harness == "terminal_like" and task.meta["family"] == "uppercase_file" and turn == 0:
        return tool_call("run_shell", command="tr a-z A-Z < in.txt")
    return oracle_action(task, turn)


def terse_slip_action(task: TaskSpec, turn: int) -> str | None:
    """`slip_action` in the terser style."""
    return slip_action(task, turn, echo=False)


def terse_action(task: TaskSpec, turn: int) -> str | None:
    """The same solution in a terser style where a harness has one: code is written without echoing
    solution.py back (shorter by 35 tokens, and nothing to check the file with)."""
    if task.harness == "code_sandbox_like":
        return _code(task, turn, echo=False)
    return oracle_action(task, turn)
