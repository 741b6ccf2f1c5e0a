"""code_sandbox_like's scripted solutions: write solution.py from a ```python block (echoing it
back, or tersely not), then SUBMIT; its gold solution.py; and its one slip (the code saved as
solve.py, not solution.py)."""

from __future__ import annotations

from harnesses.base import TaskSpec

SLIP = "every family: the code is saved as solve.py, not solution.py"
LIST_SOLUTIONS = {
    "sum_even": "def solve(xs):\n    return sum(x for x in xs if x % 2 == 0)\n",
    "count_negative": "def solve(xs):\n    return sum(1 for x in xs if x < 0)\n",
    "max_minus_min": "def solve(xs):\n    return max(xs) - min(xs)\n",
}


def reference_solution(task: TaskSpec) -> str:
    """The gold solution.py of a code task (the reward's null/gold check uses it)."""
    if task.meta["family"] == "arith":
        return f"def solve():\n    return {task.meta['expression']}\n"
    return LIST_SOLUTIONS[task.meta["kind"]]


def scripted_action(task: TaskSpec, turn: int, echo: bool = True, filename: str = "solution.py") -> str | None:
    if turn == 0:
        source = reference_solution(task)
        check = f"\nprint(open({filename!r}).read())" if echo else ""
        return f"```python\nopen({filename!r}, 'w').write({source!r}){check}\n```"
    return "SUBMIT" if turn == 1 else None
