"""Sample shaping (DAPO): which of a step's groups and episodes the trainer sees, and the reward it
sees of each.

- **Soft overlong penalty** (`training.overlong_buffer_tokens` > 0): an episode of L tokens, with
  max_len = `training.seq_len_limit` (the limit the rollout generates against and the trainer
  cuts at; L counts the whole sequence, prompt, model turns and tool output, because that is what
  the limit bounds in a multi-turn episode), loses
  `overlong_penalty * min(L - (max_len - buffer), buffer) / buffer` of its reward when
  L > max_len - buffer: 0 up to the buffer, rising linearly to the whole penalty at max_len (DAPO's
  formula, held at the whole penalty beyond). Applied to the reward `rollout.truncation` left
  (`controller.train_reward`); a masked episode (None) stays masked.
- **Overlong filtering** (`training.overlong_filter`): an episode cut at the length limit (outcome
  `truncated` with a sequence within `CONTEXT_ROOM` tokens of max_len: the rollout stops there for
  lack of room) builds no sample, so its tokens are out of the loss; its reward still counts in its
  group's mean and std (DAPO masks the loss only). A turn-limit truncation is not overlong.
- **Dynamic sampling** (`rollout.dynamic_sampling`): a group whose shaped rewards are all equal
  (masked episodes left out; fewer than two left counts as equal) has zero advantage everywhere and
  is dropped before the step; the step takes more groups off the buffer to fill its batch, at most
  `rollout.max_refill_rounds` times (in sync mode each round first generates the groups it lacks).
  Past that it trains on the groups with signal it has; with none it is skipped: nothing reaches
  the trainer, the step still counts (the run ends on time) and `rollout/skipped_steps` says so.

Belongs here: these rules and the batch assembly. Not here: advantages (`learner/grpo.py`), the
buffer's staleness (`runtime/rollout/buffer.py`), the step's timing and row (`run/loop/steps.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Awaitable, Callable

from agentrl_cli.runtime.observe import keys
from agentrl_cli.core.outcomes import Outcome

CONTEXT_ROOM = 8  # as runtime/rollout/turns.py: the loop stops generating when fewer tokens than this are left before seq_len_limit


def overlong_penalty(length: int, max_len: int, buffer: int, penalty: float) -> float:
    """What DAPO's soft overlong punishment takes off the reward of a sequence of `length` tokens."""
    if buffer <= 0 or penalty == 0 or length <= max_len - buffer:
        return 0.0
    return penalty * min(length - (max_len - buffer), buffer) / buffer


def is_overlong(record, max_len: int) -> bool:
    """Cut at the length limit: truncated, with no room left to generate."""
    return record.outcome == Outcome.TRUNCATED and len(record.token_ids) >= max_len - CONTEXT_ROOM


def has_signal(rewards) -> bool:
    """A GRPO group with a learning signal: at least two rewards (None = masked, left out), not all equal."""
    values = [r for r in rewards if r is not None]
    return len(values) >= 2 and max(values) != min(values)


class Shaping:
    """The reward the trainer sees of an episode and whether its tokens are trained (`training.*`)."""

    def __init__(self, training) -> None:
        self.max_len = training.seq_len_limit
        self.buffer = training.overlong_buffer_tokens
        self.penalty = training.overlong_penalty
        self.filter = training.overlong_filter
        self.per_turn = getattr(training, "advantage", "episode") == "turn"

    def reward(self, episode) -> float | None:
        if episode.reward is None or self.buffer <= 0:
            return episode.reward
        return episode.reward - overlong_penalty(len(episode.record.token_ids), self.max_len, self.buffer, self.penalty)

    def trains(self, episode) -> bool:
        """Its samples go to the trainer: scored, and not filtered as overlong."""
        return episode.reward is not None and not (self.filter and is_overlong(episode.record, self.max_len))

    def group_has_signal(self, group) -> bool:
        """Its rewards differ; with `training.advantage: turn` also when the step rewards of some
        turn index differ (a group flat in outcome still teaches its turns)."""
        if has_signal([self.reward(e) for e in group]):
            return True
        return self.per_turn and any(has_signal(turn) for turn in _step_rewards_by_turn(group))


def own_step_rewards(record) -> list[float]:
    """The stored step rewards of the record's own turns: its role's steps in a multi-agent episode, all otherwise."""
    role = getattr(record, "role", None)
    return [float(s.reward or 0.0) for s in (getattr(record, "steps", None) or ()) if not role or getattr(s, "role", None) == role]


def _step_rewards_by_turn(group) -> list[list[float]]:
    """Per turn index, the step rewards of the group's scored episodes that reached it."""
    by_turn: list[list[float]] = []
    for e in group:
        for t, r in enumerate(own_step_rewards(e.record) if e.reward is not None else ()):
            if t == len(by_turn):
                by_turn.append([])
            by_turn[t].append(r)
    return by_turn


@dataclass
class BatchCounts:
    """What dynamic sampling did for one step."""

    dropped_flat_groups: int = 0
    refill_rounds: int = 0
    skipped: bool = False

    def row(self, skipped_so_far: int) -> dict:
        return {keys.ROLLOUT_DROPPED_FLAT_GROUPS: self.dropped_flat_groups, keys.ROLLOUT_REFILL_ROUNDS: self.refill_rounds,
                keys.ROLLOUT_SKIPPED_STEPS: skipped_so_far}


async def fill_batch(groups: list, want: int, take: Callable[[int], Awaitable[list]], shaping: Shaping,
                     max_rounds: int) -> tuple[list, BatchCounts]:
    """The step's groups with a learning signal: `groups` without the flat ones, refilled by
    `take(n)` (up to n more groups; [] when none came in time) until `want` or `max_rounds` rounds.
    An empty list means the step trains nothing (`skipped`)."""
    counts = BatchCounts()
    kept: list = []

    def sort(batch: list) -> None:
        for g in batch:
            if shaping.group_has_signal(g):
                kept.append(g)
            else:
                counts.dropped_flat_groups += 1

    sort(groups)
    while len(kept) < want and counts.refill_rounds < max_rounds:
        counts.refill_rounds += 1
        more = await take(want - len(kept))
        if not more:
            break
        sort(more)
    counts.skipped = not kept
    return kept, counts
