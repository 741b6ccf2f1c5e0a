"""How many episodes the rollout may hold at once (in flight plus buffered), derived from a memory
budget: `rollout.max_buffer_mb`.

Belongs here: the arithmetic, shared by config validation (a budget too small for one episode is
refused at load), the rollout's buffer (`TrajectoryBuffer.from_config`) and `agentrl plan` (which
prints it). Not here: the waiting itself (`runtime/rollout/buffer.py`, `controller.py`).

An episode the rollout holds is, at most, a record of `model.context_length` tokens: its training
arrays (token id int32, loss mask int8, log-prob float32: 9 B a token), the conversation's text in its
steps (TEXT_BYTES_PER_TOKEN, a token being about 4 characters of 1-2 B), and a fixed part (the record
and step objects, its ids, prompt text and evidence: EPISODE_OVERHEAD_BYTES). Measured on 256 real
terminal_like episodes (tests/integration/test_many_in_flight.py): 12.2 KB held for 235 tokens,
against 20.4 KB estimated here, so the estimate is an upper bound. An episode in flight holds no
more than it will once buffered, so in flight and buffered count alike:

    bytes per episode = context_length x (9 + TEXT_BYTES_PER_TOKEN) + EPISODE_OVERHEAD_BYTES
    episodes the budget holds = floor(max_buffer_mb x 2^20 / bytes per episode)
    episodes held at most = min(buffer_size, episodes the budget holds)

Both keys are ceilings, so they never conflict: the smaller binds, `agentrl plan` says which, and a run
logs the limit when the budget is the one that binds. Only a budget that holds not one episode is
refused at load.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

MB = 2**20
ARRAY_BYTES_PER_TOKEN = 4 + 1 + 4  # token id (int32), loss mask (int8), log-prob (float32)
TEXT_BYTES_PER_TOKEN = 8  # the conversation's text kept in the record's steps
EPISODE_OVERHEAD_BYTES = 16 * 1024  # record and step objects, ids, prompt, evidence


@dataclass(frozen=True)
class BufferLimit:
    """The rollout's limit on episodes held (in flight plus buffered) and how it was derived."""

    max_buffer_mb: float
    context_length: int
    buffer_size: int
    bytes_per_episode: int
    budget_episodes: int  # what the budget holds
    capacity: int  # episodes held at most: min(buffer_size, budget_episodes), at least 1
    binds: str  # the key that sets `capacity`

    def formula(self) -> str:
        return (f"min(rollout.buffer_size {self.buffer_size}, floor(rollout.max_buffer_mb {self.max_buffer_mb:g} MiB / "
                f"(model.context_length {self.context_length} x {ARRAY_BYTES_PER_TOKEN + TEXT_BYTES_PER_TOKEN} B/token + "
                f"{EPISODE_OVERHEAD_BYTES // 1024} KiB) = {self.budget_episodes})); {self.binds} binds")

    def to_dict(self) -> dict:
        return asdict(self)


def episode_bytes(tokens: int) -> int:
    """Estimated bytes the rollout holds for one episode of `tokens` tokens."""
    return tokens * (ARRAY_BYTES_PER_TOKEN + TEXT_BYTES_PER_TOKEN) + EPISODE_OVERHEAD_BYTES


def buffer_limit(max_buffer_mb: float, buffer_size: int, context_length: int) -> BufferLimit:
    per = episode_bytes(context_length)
    budget = int(max_buffer_mb * MB // per)
    capacity = max(1, min(buffer_size, budget))
    binds = "rollout.buffer_size" if buffer_size <= budget else "rollout.max_buffer_mb"
    return BufferLimit(max_buffer_mb, context_length, buffer_size, per, budget, capacity, binds)


def too_small(limit: BufferLimit) -> str | None:
    """Why the budget cannot work (it holds not one episode at the context length), or None."""
    if limit.budget_episodes >= 1:
        return None
    return (f"rollout.max_buffer_mb {limit.max_buffer_mb:g} MiB holds no episode of model.context_length "
            f"{limit.context_length} tokens ({limit.bytes_per_episode / MB:.3g} MiB each); raise rollout.max_buffer_mb "
            f"to at least {limit.bytes_per_episode / MB:.3g} (or lower model.context_length)")
