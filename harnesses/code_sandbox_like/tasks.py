"""code_sandbox_like's task families (generators for `harnesses.taskgen`): functions graded by
hidden tests."""

from __future__ import annotations

import random

from harnesses.taskgen import arith

WHAT = {"sum_even": "the sum of the even numbers in xs", "count_negative": "how many numbers in xs are negative",
        "max_minus_min": "the largest number in xs minus the smallest"}
FN = {"sum_even": lambda xs: sum(x for x in xs if x % 2 == 0), "count_negative": lambda xs: sum(x < 0 for x in xs),
      "max_minus_min": lambda xs: max(xs) - min(xs)}


def compute(harness: str, split: str, i: int, rng: random.Random, meta: dict) -> tuple[str, object]:
    expr, answer = arith(rng, 1 + i % 3)
    meta.update(verify="tests", tests=[{"id": "value", "args": [], "expected": answer}])
    meta["expression"] = expr
    return f"Write solution.py defining solve() that returns the value of {expr}.", answer


def list_function(harness: str, split: str, i: int, rng: random.Random, meta: dict) -> tuple[str, object]:
    d = 1 + i % 3
    kind = ("sum_even", "count_negative", "max_minus_min")[i % 3]
    cases = [[rng.randint(-20, 20) for _ in range(rng.randint(1, 4 + 2 * d))] for _ in range(4)]
    meta.update(verify="tests", kind=kind, tests=[{"id": f"case{j}", "args": [xs], "expected": FN[kind](xs)}
                                                  for j, xs in enumerate(cases)])
    return f"Write solution.py defining solve(xs) that returns {WHAT[kind]}.", None


FAMILIES = {"arith": compute, "list_function": list_function}
