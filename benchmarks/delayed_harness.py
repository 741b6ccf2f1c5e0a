"""A built-in harness with a seeded delay on some of its training episodes, for the learner benchmark
(`learner.py`): a delayed episode sleeps `delay_s` in every environment step (in the harness's
thread, as a slow tool would), so its group reaches the trainer later and trains under newer weights
than the ones that sampled it (policy lag, up to `rollout.max_staleness`).

Which episodes are delayed is a function of (`delay_seed`, task id) alone (`is_delayed`): the same
tasks are delayed in every arm that shares a seed, whatever order the episodes run in, and every
sample of a GRPO group shares its task, so a delayed task delays its whole group. Eval-split tasks
are never delayed (evaluation measures the policy, not the lag).

Load it by `module:Class` path, e.g.
    harnesses: [{name: "benchmarks.delayed_harness:DelayedTerminalLike",
                 options: {delay_s: 2.0, delayed_fraction: 0.25, delay_seed: 1}}]
"""

from __future__ import annotations

import hashlib
import time

from agentrl_cli.core.episode import TaskSet
from harnesses.terminal_like import TerminalLike


def is_delayed(delay_seed: int, task_id: str, fraction: float) -> bool:
    """Whether the task's training episodes are delayed: a uniform draw in [0, 1) from the hash of
    (seed, task id), below `fraction`."""
    digest = hashlib.sha256(f"{delay_seed}:{task_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0 ** 64 < fraction


class DelayedTerminalLike(TerminalLike):
    """terminal_like (its tasks, tools, sandboxes and scoring) with the seeded delay above."""

    name = "delayed_terminal_like"

    def __init__(self, delay_s: float = 2.0, delayed_fraction: float = 0.25, delay_seed: int = 0, **kwargs) -> None:
        if delay_s < 0 or not 0.0 <= delayed_fraction <= 1.0:
            raise ValueError(f"delay_s must be >= 0 and delayed_fraction in [0, 1], got {delay_s}, {delayed_fraction}")
        super().__init__(**kwargs)
        self.delay_s, self.delayed_fraction, self.delay_seed = float(delay_s), float(delayed_fraction), int(delay_seed)
        self._delay = 0.0

    @classmethod
    def task_set(cls) -> TaskSet:
        return TerminalLike.task_set()

    def delay_for(self, task_spec) -> float:
        """Seconds each step of an episode of `task_spec` sleeps: `delay_s` for a delayed training task, else 0."""
        delayed = task_spec.split == "train" and is_delayed(self.delay_seed, task_spec.task_id, self.delayed_fraction)
        return self.delay_s if delayed else 0.0

    def reset(self, task_spec):
        self._delay = self.delay_for(task_spec)
        return super().reset(task_spec)

    def step(self, action):
        if self._delay:
            time.sleep(self._delay)
        return super().step(action)
