"""How the built-in harnesses' task sets are made: generated from seeds, versioned, with train/eval
splits and difficulty labels, and committed as JSONL under `harnesses/tasksets/` (a test checks the
files match what `generate` makes). Each harness's own folder holds its task families (`FAMILIES`:
family name -> generator); this module holds the seeding, the splits and the files, shared by all.

A generator is `make(harness, split, i, rng, meta) -> (prompt, answer)`: it fills `meta` (which
starts as `{"family", "verify": "answer"}`) with what the harness needs: `verify` ("answer",
"state" or "tests"), `files` written into the sandbox, hidden `tests` (never shown to the agent),
`table`. Difficulty is `1 + i % 3`. One family, `arith`, is solvable through all three built-ins, so
any one can be held out and evaluated on it. Practice tasks (the built-in model's warm start) come
from separate seeds and are never one of the committed tasks.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Callable

from agentrl_cli.core.episode import TaskSpec

TASK_SET_VERSION = "2026.11.29"
SPLITS = {"train": (1000, 90), "eval": (2000, 30)}  # split -> (seed offset, tasks per family)
PRACTICE_OFFSET = 5000
DIR = Path(__file__).with_name("tasksets")
WORDS = ("alpha", "bravo", "cedar", "delta", "ember", "fjord", "gamma", "harbor", "iris", "juniper", "kiln", "lotus")

Family = Callable[[str, str, int, random.Random, dict], tuple[str, object]]


def arith(rng: random.Random, d: int) -> tuple[str, int]:
    """An arithmetic expression of difficulty `d` and its value."""
    a, b, c = rng.randint(2, 49), rng.randint(2, 49), rng.randint(2, 9)
    expr = {1: f"{a} + {b}", 2: f"{a} * {c} - {b}", 3: f"({a} + {b}) * {c} - {rng.randint(1, 20)}"}[d]
    return expr, int(eval(expr, {"__builtins__": {}}))  # noqa: S307 - our own digits and operators


def make_task(harness: str, family: str, make: Family, split: str, i: int, rng: random.Random) -> TaskSpec:
    meta: dict = {"family": family, "verify": "answer"}
    prompt, answer = make(harness, split, i, rng, meta)
    return TaskSpec(task_id=f"{harness}/{family}/{split}/{i:04d}", harness=harness, prompt=prompt, answer=answer,
                    difficulty=1 + i % 3, split=split, meta=meta)


def generate(harness: str, families: dict[str, Family], split: str) -> list[TaskSpec]:
    """The tasks of one split, family by family, each family from its own seed."""
    offset, per_family = SPLITS[split]
    out = []
    for family, make in families.items():
        rng = random.Random(f"{TASK_SET_VERSION}/{harness}/{family}/{offset}")
        out += [make_task(harness, family, make, split, i, rng) for i in range(per_family)]
    return out


def practice(harness: str, families: dict[str, Family], per_family: int, offset: int = PRACTICE_OFFSET) -> list[TaskSpec]:
    """`per_family` more tasks of every family from seed `offset` (split "train", ids
    `<harness>/<family>/practice/<i>`), leaving out any equal to a committed task (same prompt,
    files and hidden tests), so practice never rehearses a task that training or evaluation uses."""
    seen = {_identity(t) for t in committed(harness)}
    out = []
    for family, make in families.items():
        rng = random.Random(f"{TASK_SET_VERSION}/{harness}/{family}/{offset}")
        for i in range(per_family):
            task = make_task(harness, family, make, "train", i, rng)
            if _identity(task) not in seen:
                out.append(replace(task, task_id=f"{harness}/{family}/practice/{i:04d}"))
    return out


def _identity(task: TaskSpec) -> tuple[str, str]:
    return task.prompt, json.dumps({k: task.meta.get(k) for k in ("files", "tests")}, sort_keys=True)


def path(harness: str) -> Path:
    return DIR / f"{harness}.jsonl"


def committed_names() -> list[str]:
    """The harnesses whose task sets are committed here."""
    return sorted(p.stem for p in DIR.glob("*.jsonl"))


@lru_cache(maxsize=None)
def committed(harness: str) -> tuple[TaskSpec, ...]:
    """The committed task set of a harness, as written."""
    rows = [json.loads(line) for line in path(harness).read_text(encoding="utf-8").splitlines() if line]
    return tuple(TaskSpec(**r) for r in rows)
