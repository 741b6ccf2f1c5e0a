"""The committed task sets of the built-in harnesses, by harness name: a facade over each harness's
own task hooks (`CommittedTasks` in `harnesses.builtin`; the families live in each harness's folder)
and the files under `harnesses/tasksets/` (`harnesses.taskgen`).

`python -m harnesses.tasks` regenerates the committed JSONL files (a test checks they match).
`practice_tasks()` draws more tasks from separate seeds (never one of the committed tasks) for the
built-in model's warm start; they are generated on demand, not committed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict

from harnesses.taskgen import DIR, PRACTICE_OFFSET, SPLITS, TASK_SET_VERSION, WORDS, committed, committed_names, path
from harnesses.base import TaskSpec

__all__ = ["DIR", "PRACTICE_OFFSET", "SPLITS", "TASK_SET_VERSION", "WORDS", "generate",
           "load_tasks", "practice_tasks", "task_set_digest", "write_task_sets"]


def _cls(harness: str):
    from harnesses.registry import resolve

    return resolve(harness)


def __getattr__(name: str):
    if name == "HARNESS_FAMILIES":  # harness -> its task families, for the harnesses with committed task sets
        return {h: tuple(_cls(h).FAMILIES) for h in committed_names()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def generate(harness: str, split: str) -> list[TaskSpec]:
    return _cls(harness).generate(split)


def practice_tasks(harness: str, per_family: int, offset: int = PRACTICE_OFFSET) -> list[TaskSpec]:
    """`per_family` more tasks of every family of `harness` (see `harnesses.taskgen.practice`)."""
    return _cls(harness).practice_tasks(per_family, offset)


def write_task_sets() -> None:
    DIR.mkdir(exist_ok=True)
    for harness in committed_names():
        rows = [asdict(t) for split in SPLITS for t in generate(harness, split)]
        path(harness).write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows), encoding="utf-8")


def load_tasks(harness: str, split: str | None = None, family: str | None = None) -> list[TaskSpec]:
    """The committed task set of a harness, optionally one split and one family."""
    return [t for t in committed(harness) if (split is None or t.split == split) and (family is None or t.meta["family"] == family)]


def task_set_digest() -> str:
    h = hashlib.sha256()
    for harness in committed_names():
        h.update(path(harness).read_bytes())
    return h.hexdigest()[:12]


if __name__ == "__main__":
    write_task_sets()
    print(f"wrote task sets {TASK_SET_VERSION} ({task_set_digest()}) to {DIR}")
