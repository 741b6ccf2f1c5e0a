"""The bounded buffer between rollout and trainer, with staleness control.

`put` waits while the buffer is full (backpressure: the rollout stops starting episodes); `take`
returns whole GRPO groups whose oldest token was produced no more than `max_staleness` policy
versions before the trainer's current one, and drops (and counts) the rest. Versions are integers
(the trainer's weight version; the inference server reports them as strings). Its capacity, which the
controller also counts episodes in flight against, is `rollout.buffer_size` or fewer when
`rollout.max_buffer_mb` holds fewer (`from_config`; the arithmetic is `config/buffer_budget.py`).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from agentrl_cli.config.buffer_budget import BufferLimit, buffer_limit


@dataclass
class Episode:
    """One finished, scored trajectory as the trainer needs it."""

    group_id: str
    record: Any  # agentrl_cli.runtime.data.schema.TrajectoryRecord
    version: int  # oldest policy version that produced any of its tokens
    reward: float | None  # None: masked (infra_error)
    tokens: int = 0  # tokens generated for it by this process (0 when reloaded from the store after a resume)
    meta: dict = field(default_factory=dict)


class TrajectoryBuffer:
    def __init__(self, capacity: int, max_staleness: int, group_size: int) -> None:
        self.capacity, self.max_staleness, self.group_size = capacity, max_staleness, group_size
        self._groups: OrderedDict[str, list[Episode]] = OrderedDict()
        self._cond = asyncio.Condition()
        self.counters = {"put": 0, "taken": 0, "dropped_stale": 0, "waits_full": 0}
        self.limit: BufferLimit | None = None  # how the capacity was derived (from_config)

    @classmethod
    def from_config(cls, cfg) -> "TrajectoryBuffer":
        """The run's buffer: capacity from `rollout.buffer_size` and `rollout.max_buffer_mb` (the smaller binds)."""
        r = cfg.rollout
        limit = buffer_limit(r.max_buffer_mb, r.buffer_size, cfg.model.context_length)
        buffer = cls(limit.capacity, r.max_staleness, r.group_size)
        buffer.limit = limit
        return buffer

    def __len__(self) -> int:
        return sum(len(g) for g in list(self._groups.values()))  # a copy: the run's gateway reads it from its thread

    def usable(self, filling: set[str]) -> int:
        """Buffered episodes that can still be trained: those of complete groups and of the groups in
        `filling` (members still being generated); a group that lost a member to an error is not.
        Safe to call from another thread (the gateway's admission reads it)."""
        return sum(len(g) for gid, g in list(self._groups.items()) if len(g) >= self.group_size or gid in filling)

    def ready_groups(self) -> int:
        return sum(len(g) >= self.group_size for g in self._groups.values())

    async def put(self, episode: Episode) -> None:
        async with self._cond:
            if len(self) >= self.capacity:
                self.counters["waits_full"] += 1
            await self._cond.wait_for(lambda: len(self) < self.capacity)
            self._groups.setdefault(episode.group_id, []).append(episode)
            self.counters["put"] += 1
            self._cond.notify_all()

    def drop_stale(self, current_version: int) -> int:
        """Remove groups older than max_staleness versions; returns the episodes dropped."""
        dropped = 0
        for gid in list(self._groups):
            if any(current_version - e.version > self.max_staleness for e in self._groups[gid]):
                dropped += len(self._groups.pop(gid))
        self.counters["dropped_stale"] += dropped
        return dropped

    async def take(self, n_groups: int, current_version: int, timeout: float | None = None) -> list[list[Episode]]:
        """Up to `n_groups` complete, fresh groups (waits until there are that many, or the timeout)."""
        async with self._cond:
            def enough() -> bool:
                self.drop_stale(current_version)
                return self.ready_groups() >= n_groups
            try:
                await asyncio.wait_for(self._cond.wait_for(enough), timeout)
            except asyncio.TimeoutError:
                pass
            out = []
            for gid in list(self._groups):
                if len(out) == n_groups:
                    break
                if len(self._groups[gid]) >= self.group_size:
                    out.append(self._groups.pop(gid))
            self.counters["taken"] += sum(len(g) for g in out)
            self._cond.notify_all()
            return out

    def state_dict(self) -> dict:
        """What a checkpoint keeps: the episodes not yet trained on (their records' ids)."""
        return {"pending": [e.record.trajectory_id for g in self._groups.values() for e in g],
                "counters": dict(self.counters)}
