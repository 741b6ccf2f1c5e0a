"""tool_api_like's task families (generators for `harnesses.taskgen`): arithmetic for the
calculator, and sums over a table reached through the lookup API."""

from __future__ import annotations

import random

from harnesses.taskgen import WORDS, arith


def compute(harness: str, split: str, i: int, rng: random.Random, meta: dict) -> tuple[str, object]:
    expr, answer = arith(rng, 1 + i % 3)
    meta["expression"] = expr
    return f"Compute the value of {expr}.", answer


def lookup_sum(harness: str, split: str, i: int, rng: random.Random, meta: dict) -> tuple[str, object]:
    table = f"inv-{split}-{i:04d}"
    rows = {rng.choice(WORDS) + str(k): rng.randint(1, 30) for k in range(2 + (1 + i % 3))}
    meta.update(table=table, rows=rows, keys=sorted(rows))
    return f"Table {table} lists stock per item. What is the total stock of all its items?", sum(rows.values())


FAMILIES = {"arith": compute, "lookup_sum": lookup_sum}
