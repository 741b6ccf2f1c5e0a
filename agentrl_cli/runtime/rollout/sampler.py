"""The task sampler: GRPO groups (`group_size` samples of one task drawn together), a weighted mix
over harnesses, and an optional curriculum (start easy, move on as the policy learns).
The curriculum keeps the harness mix and, within a harness, draws a (family, difficulty) bucket with
weight p·(1-p) + CURRICULUM_FLOOR, p being the bucket's recent success rate (unseen: 0.5). A GRPO group
only teaches when its samples disagree, and p·(1-p) is how often they do: buckets the policy always
or never solves fade, those it solves sometimes come up most, and as p moves the weights follow.

Deterministic from its seed; `state_dict()` / `load_state_dict()` make the position part of a
checkpoint, so a resumed run draws exactly the tasks it would have drawn.
"""

from __future__ import annotations

import random
from collections import defaultdict, deque
from dataclasses import dataclass

from harnesses.base import TaskSpec

WINDOW = 64  # recent outcomes per (harness, family, difficulty) bucket that drive the curriculum
CURRICULUM_FLOOR = 0.02  # a bucket solved always or never is still drawn now and then, to notice change


@dataclass(frozen=True)
class Draw:
    task: TaskSpec
    group_id: str  # the same for the group_size samples of one task draw
    index: int  # sample index within the group
    seed: int  # sampling seed of this sample (reproducible generations)


class TaskSampler:
    def __init__(self, tasks: dict[str, list[TaskSpec]], weights: dict[str, float] | None = None, *,
                 group_size: int = 4, seed: int = 0, curriculum: bool = False) -> None:
        self.tasks = {h: list(ts) for h, ts in tasks.items() if ts}
        if not self.tasks:
            raise ValueError("no tasks to sample: every configured harness has an empty task set")
        self.weights = {h: float((weights or {}).get(h, 1.0)) for h in self.tasks}
        if sum(self.weights.values()) <= 0:
            raise ValueError("harness weights sum to zero; give at least one training harness a positive weight")
        self.group_size, self.seed, self.curriculum = group_size, seed, curriculum
        self.rng = random.Random(seed)
        self.groups_drawn = 0
        self.recent: dict[tuple[str, str, int], deque] = defaultdict(lambda: deque(maxlen=WINDOW))
        self._bucket_cache: dict[str, dict] = {}

    def next_group(self) -> list[Draw]:
        names = sorted(self.tasks)
        harness = self.rng.choices(names, weights=[self.weights[h] for h in names])[0]
        pool = self.tasks[harness]
        if self.curriculum:
            pool = self._by_curriculum(harness)
        task = pool[self.rng.randrange(len(pool))]
        group_id = f"g{self.seed}-{self.groups_drawn:07d}"
        base = self.rng.getrandbits(31)
        self.groups_drawn += 1
        return [Draw(task, group_id, i, base + i) for i in range(self.group_size)]

    def _by_curriculum(self, harness: str) -> list[TaskSpec]:
        """The tasks of one (family, difficulty) bucket, drawn with weight p(1-p) + floor."""
        buckets = self._buckets(harness)
        keys = sorted(buckets)
        weights = [self.learnability(harness, *key) for key in keys]
        return buckets[self.rng.choices(keys, weights=weights)[0]]

    def learnability(self, harness: str, family: str, difficulty: int) -> float:
        seen = self.recent.get((harness, family, difficulty))
        p = sum(seen) / len(seen) if seen else 0.5
        return p * (1 - p) + CURRICULUM_FLOOR

    def _buckets(self, harness: str) -> dict[tuple[str, int], list[TaskSpec]]:
        if harness not in self._bucket_cache:
            out: dict[tuple[str, int], list[TaskSpec]] = defaultdict(list)
            for t in self.tasks[harness]:
                out[(_family(t), t.difficulty)].append(t)
            self._bucket_cache[harness] = dict(out)
        return self._bucket_cache[harness]

    def record(self, task: TaskSpec, success: bool) -> None:
        """Feed an outcome back (drives the curriculum)."""
        self.recent[(task.harness, _family(task), task.difficulty)].append(1.0 if success else 0.0)

    def state_dict(self) -> dict:
        return {"rng": self.rng.getstate(), "groups_drawn": self.groups_drawn,
                "recent": {f"{h}|{f}|{d}": list(v) for (h, f, d), v in self.recent.items()}}

    def load_state_dict(self, state: dict) -> None:
        rng = state["rng"]
        self.rng.setstate((rng[0], tuple(rng[1]), rng[2]) if isinstance(rng, list) else rng)
        self.groups_drawn = int(state["groups_drawn"])
        self.recent = defaultdict(lambda: deque(maxlen=WINDOW))
        for key, values in state.get("recent", {}).items():
            parts = key.split("|")
            if len(parts) == 3:  # (a checkpoint from before families were buckets keeps no history)
                self.recent[(parts[0], parts[1], int(parts[2]))].extend(values)


def _family(task: TaskSpec) -> str:
    return str(task.meta.get("family", "")) if isinstance(task.meta, dict) else ""
