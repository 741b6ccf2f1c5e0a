"""The task sampler: GRPO groups (`group_size` samples of one task drawn together), a weighted mix
over harnesses, and an optional curriculum that favours the difficulty whose recent success rate is
closest to one half (seed 000 §5: start easy, move on as the policy learns).

Deterministic from its seed; `state_dict()` / `load_state_dict()` make the position part of a
checkpoint, so a resumed run draws exactly the tasks it would have drawn.
"""

from __future__ import annotations

import random
from collections import defaultdict, deque
from dataclasses import dataclass

from harnesses.base import TaskSpec

WINDOW = 64  # recent outcomes per (harness, difficulty) that drive the curriculum


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
        self.recent: dict[tuple[str, int], deque] = defaultdict(lambda: deque(maxlen=WINDOW))

    def next_group(self) -> list[Draw]:
        names = sorted(self.tasks)
        harness = self.rng.choices(names, weights=[self.weights[h] for h in names])[0]
        pool = self.tasks[harness]
        if self.curriculum:
            pool = self._by_curriculum(harness, pool)
        task = pool[self.rng.randrange(len(pool))]
        group_id = f"g{self.seed}-{self.groups_drawn:07d}"
        base = self.rng.getrandbits(31)
        self.groups_drawn += 1
        return [Draw(task, group_id, i, base + i) for i in range(self.group_size)]

    def _by_curriculum(self, harness: str, pool: list[TaskSpec]) -> list[TaskSpec]:
        """Tasks of the difficulty whose recent success rate is nearest 0.5 (unseen ones count as 0.5)."""
        levels = sorted({t.difficulty for t in pool})

        def rate(d: int) -> float:
            seen = self.recent[(harness, d)]
            return sum(seen) / len(seen) if seen else 0.5
        best = min(levels, key=lambda d: (abs(rate(d) - 0.5), d))
        return [t for t in pool if t.difficulty == best]

    def record(self, task: TaskSpec, success: bool) -> None:
        """Feed an outcome back (drives the curriculum)."""
        self.recent[(task.harness, task.difficulty)].append(1.0 if success else 0.0)

    def state_dict(self) -> dict:
        return {"rng": self.rng.getstate(), "groups_drawn": self.groups_drawn,
                "recent": {f"{h}|{d}": list(v) for (h, d), v in self.recent.items()}}

    def load_state_dict(self, state: dict) -> None:
        rng = state["rng"]
        self.rng.setstate((rng[0], tuple(rng[1]), rng[2]) if isinstance(rng, list) else rng)
        self.groups_drawn = int(state["groups_drawn"])
        self.recent = defaultdict(lambda: deque(maxlen=WINDOW))
        for key, values in state.get("recent", {}).items():
            h, d = key.rsplit("|", 1)
            self.recent[(h, int(d))].extend(values)
