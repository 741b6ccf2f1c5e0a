"""Task sets: generated from seeds, versioned, with train/eval splits and difficulty labels.

`generate()` is deterministic; `python -m harnesses.tasks` writes the committed JSONL files under
`harnesses/tasksets/` and a test checks they match. One family, `arith` (compute a quantity), is
solvable through all three harnesses, so any one harness can be held out and evaluated on it.
`practice_tasks()` draws more tasks from separate seeds (never one of the committed tasks) for the
built-in model's warm start; they are generated on demand, not committed.
Each task's `meta` holds what the harness needs: `family`, `verify` ("answer", "state" or
"tests"), `files` written into the sandbox, hidden `tests` (never shown to the agent), `table`.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import asdict, replace
from functools import lru_cache
from pathlib import Path

from harnesses.base import TaskSpec

TASK_SET_VERSION = "2026.11.29"
SPLITS = {"train": (1000, 90), "eval": (2000, 30)}  # split -> (seed offset, tasks per family)
PRACTICE_OFFSET = 5000
HARNESS_FAMILIES = {
    "terminal_like": ("arith", "count_matches", "sum_column", "uppercase_file"),
    "code_sandbox_like": ("arith", "list_function"),
    "tool_api_like": ("arith", "lookup_sum"),
}
DIR = Path(__file__).with_name("tasksets")
WORDS = ("alpha", "bravo", "cedar", "delta", "ember", "fjord", "gamma", "harbor", "iris", "juniper", "kiln", "lotus")


def _arith(rng: random.Random, d: int) -> tuple[str, int]:
    a, b, c = rng.randint(2, 49), rng.randint(2, 49), rng.randint(2, 9)
    expr = {1: f"{a} + {b}", 2: f"{a} * {c} - {b}", 3: f"({a} + {b}) * {c} - {rng.randint(1, 20)}"}[d]
    return expr, int(eval(expr, {"__builtins__": {}}))  # noqa: S307 - our own digits and operators


def _task(harness: str, family: str, split: str, i: int, rng: random.Random) -> TaskSpec:
    d = 1 + i % 3
    tid = f"{harness}/{family}/{split}/{i:04d}"
    meta: dict = {"family": family, "verify": "answer"}
    if family == "arith":
        expr, answer = _arith(rng, d)
        if harness == "code_sandbox_like":
            prompt = f"Write solution.py defining solve() that returns the value of {expr}."
            meta.update(verify="tests", tests=[{"id": "value", "args": [], "expected": answer}])
        elif harness == "tool_api_like":
            prompt = f"Compute the value of {expr}."
        else:
            prompt = f"Compute the value of {expr}."
        meta["expression"] = expr
    elif family == "count_matches":
        word = rng.choice(WORDS)
        lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 5))) for _ in range(4 + 4 * d)]
        answer = sum(word in line.split() for line in lines)
        prompt = f"How many lines of notes.txt contain the word {word}?"
        meta["files"] = {"notes.txt": "\n".join(lines) + "\n"}
    elif family == "sum_column":
        rows = [(rng.choice(WORDS), rng.randint(1, 20 * d)) for _ in range(3 + 2 * d)]
        answer = sum(q for _, q in rows)
        prompt = "What is the sum of the quantity column of inventory.csv?"
        meta["files"] = {"inventory.csv": "item,quantity\n" + "".join(f"{n},{q}\n" for n, q in rows)}
    elif family == "uppercase_file":
        text = " ".join(rng.choice(WORDS) for _ in range(3 * d)) + "\n"
        answer = text.upper()
        prompt = "Write the contents of in.txt in upper case to out.txt."
        meta.update(verify="state", files={"in.txt": text}, state={"out.txt": answer})
    elif family == "list_function":
        kind = ("sum_even", "count_negative", "max_minus_min")[i % 3]
        what = {"sum_even": "the sum of the even numbers in xs", "count_negative": "how many numbers in xs are negative",
                "max_minus_min": "the largest number in xs minus the smallest"}[kind]
        fn = {"sum_even": lambda xs: sum(x for x in xs if x % 2 == 0), "count_negative": lambda xs: sum(x < 0 for x in xs),
              "max_minus_min": lambda xs: max(xs) - min(xs)}[kind]
        cases = [[rng.randint(-20, 20) for _ in range(rng.randint(1, 4 + 2 * d))] for _ in range(4)]
        prompt = f"Write solution.py defining solve(xs) that returns {what}."
        meta.update(verify="tests", kind=kind, tests=[{"id": f"case{j}", "args": [xs], "expected": fn(xs)} for j, xs in enumerate(cases)])
        answer = None
    elif family == "lookup_sum":
        table = f"inv-{split}-{i:04d}"
        rows = {rng.choice(WORDS) + str(k): rng.randint(1, 30) for k in range(2 + d)}
        keys = sorted(rows)
        answer = sum(rows.values())
        prompt = f"Table {table} lists stock per item. What is the total stock of all its items?"
        meta.update(table=table, rows=rows, keys=keys)
    else:  # pragma: no cover - guarded by HARNESS_FAMILIES
        raise ValueError(family)
    return TaskSpec(task_id=tid, harness=harness, prompt=prompt, answer=answer, difficulty=d, split=split, meta=meta)


def generate(harness: str, split: str) -> list[TaskSpec]:
    offset, per_family = SPLITS[split]
    out = []
    for f, family in enumerate(HARNESS_FAMILIES[harness]):
        rng = random.Random(f"{TASK_SET_VERSION}/{harness}/{family}/{offset}")
        out += [_task(harness, family, split, i, rng) for i in range(per_family)]
    return out


def practice_tasks(harness: str, per_family: int, offset: int = PRACTICE_OFFSET) -> list[TaskSpec]:
    """`per_family` more tasks of every family of `harness` from seed `offset` (split "train", ids
    `<harness>/<family>/practice/<i>`). A task equal to one of the committed task set (same prompt,
    files and hidden tests) is left out, so practice never rehearses a task that reinforcement
    learning trains on or that evaluation scores."""
    seen = {_identity(t) for t in load_tasks(harness)}
    out = []
    for family in HARNESS_FAMILIES[harness]:
        rng = random.Random(f"{TASK_SET_VERSION}/{harness}/{family}/{offset}")
        for i in range(per_family):
            task = _task(harness, family, "train", i, rng)
            if _identity(task) not in seen:
                out.append(replace(task, task_id=f"{harness}/{family}/practice/{i:04d}"))
    return out


def _identity(task: TaskSpec) -> tuple[str, str]:
    return task.prompt, json.dumps({k: task.meta.get(k) for k in ("files", "tests")}, sort_keys=True)


def _path(harness: str) -> Path:
    return DIR / f"{harness}.jsonl"


def write_task_sets() -> None:
    DIR.mkdir(exist_ok=True)
    for harness in HARNESS_FAMILIES:
        rows = [asdict(t) for split in SPLITS for t in generate(harness, split)]
        _path(harness).write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows), encoding="utf-8")


@lru_cache(maxsize=None)
def _load(harness: str) -> tuple[TaskSpec, ...]:
    rows = [json.loads(line) for line in _path(harness).read_text(encoding="utf-8").splitlines() if line]
    return tuple(TaskSpec(**r) for r in rows)


def load_tasks(harness: str, split: str | None = None, family: str | None = None) -> list[TaskSpec]:
    """The committed task set of a harness, optionally one split and one family."""
    return [t for t in _load(harness) if (split is None or t.split == split) and (family is None or t.meta["family"] == family)]


def task_set_digest() -> str:
    h = hashlib.sha256()
    for harness in sorted(HARNESS_FAMILIES):
        h.update(_path(harness).read_bytes())
    return h.hexdigest()[:12]


if __name__ == "__main__":
    write_task_sets()
    print(f"wrote task sets {TASK_SET_VERSION} ({task_set_digest()}) to {DIR}")
