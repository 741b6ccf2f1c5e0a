"""terminal_like's task families (generators for `harnesses.taskgen`): arithmetic, and questions
about files answered or verified by the sandbox's final state."""

from __future__ import annotations

import random

from harnesses.taskgen import WORDS, arith


def compute(harness: str, split: str, i: int, rng: random.Random, meta: dict) -> tuple[str, object]:
    expr, answer = arith(rng, 1 + i % 3)
    meta["expression"] = expr
    return f"Compute the value of {expr}.", answer


def count_matches(harness: str, split: str, i: int, rng: random.Random, meta: dict) -> tuple[str, object]:
    d = 1 + i % 3
    word = rng.choice(WORDS)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 5))) for _ in range(4 + 4 * d)]
    meta["files"] = {"notes.txt": "\n".join(lines) + "\n"}
    return f"How many lines of notes.txt contain the word {word}?", sum(word in line.split() for line in lines)


def sum_column(harness: str, split: str, i: int, rng: random.Random, meta: dict) -> tuple[str, object]:
    d = 1 + i % 3
    rows = [(rng.choice(WORDS), rng.randint(1, 20 * d)) for _ in range(3 + 2 * d)]
    meta["files"] = {"inventory.csv": "item,quantity\n" + "".join(f"{n},{q}\n" for n, q in rows)}
    return "What is the sum of the quantity column of inventory.csv?", sum(q for _, q in rows)


def uppercase_file(harness: str, split: str, i: int, rng: random.Random, meta: dict) -> tuple[str, object]:
    text = " ".join(rng.choice(WORDS) for _ in range(3 * (1 + i % 3))) + "\n"
    meta.update(verify="state", files={"in.txt": text}, state={"out.txt": text.upper()})
    return "Write the contents of in.txt in upper case to out.txt.", text.upper()


FAMILIES = {"arith": compute, "count_matches": count_matches, "sum_column": sum_column, "uppercase_file": uppercase_file}
