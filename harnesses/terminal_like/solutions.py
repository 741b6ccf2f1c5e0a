"""terminal_like's scripted solutions: one shell command, then the answer line; and its one slip
(the upper-cased text printed, never written to out.txt)."""

from __future__ import annotations

from harnesses.base import TaskSpec
from harnesses.parsing import tool_call

SLIP = "uppercase_file: the upper-cased text is printed, never written to out.txt"


def scripted_action(task: TaskSpec, turn: int) -> str | None:
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


def slip_action(task: TaskSpec, turn: int) -> str | None:
    if task.meta["family"] == "uppercase_file" and turn == 0:
        return tool_call("run_shell", command="tr a-z A-Z < in.txt")
    return scripted_action(task, turn)
