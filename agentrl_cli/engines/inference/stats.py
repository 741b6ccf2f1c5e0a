"""Counters the embedded engine keeps for `/metrics` and `/server_info`. Plain numbers, no
Prometheus types: the HTTP layer (`metrics.py`) turns a snapshot into SGLang-named metrics.
The engine updates an `EngineStats` under its own lock, except the phase counters (`prefill`,
`decode`), which only the scheduler thread writes, one number at a time, while a batch runs.

Phase counters (cumulative, in `/server_info`'s internal_states, PHASE_COUNTERS): seconds and tokens
of prefill (the prompt tokens a forward pass computed: prompt less what the prefix cache served,
late joiners' prefill included) and of decode (each step: sampling the rows' next tokens, dropping
finished rows and the forward pass of the rows left), decode steps with a forward pass, and the
rows of those passes (their mean over the steps is the batch occupancy)."""

from __future__ import annotations

import bisect
import time
from collections import deque
from dataclasses import dataclass, field

# SGLang's buckets for sglang:e2e_request_latency_seconds, with finer ones for small CPU models
E2E_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0,
               80.0, 100.0, 200.0, 400.0, 800.0)
THROUGHPUT_WINDOW_BATCHES = 16
PHASE_COUNTERS = ("prefill_seconds_total", "prefill_tokens_total", "decode_seconds_total", "decode_tokens_total",
                  "decode_steps_total", "decode_rows_total")


@dataclass
class EngineStats:
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    cached_tokens_total: int = 0  # prompt tokens served from the prefix cache
    num_requests_total: int = 0
    num_aborted_requests_total: int = 0
    e2e_sum: float = 0.0
    e2e_count: int = 0
    e2e_counts: list[int] = field(default_factory=lambda: [0] * (len(E2E_BUCKETS) + 1))  # last: +Inf
    batches: deque = field(default_factory=lambda: deque(maxlen=THROUGHPUT_WINDOW_BATCHES))
    batch_sizes: deque = field(default_factory=lambda: deque(maxlen=THROUGHPUT_WINDOW_BATCHES))
    joins: deque = field(default_factory=lambda: deque(maxlen=THROUGHPUT_WINDOW_BATCHES))
    last_gen_throughput: float = 0.0
    busy_seconds_done: float = 0.0  # time spent inside finished batches (prefill, decode steps, joins)
    busy_since: float | None = None  # monotonic start of the batch running now
    prefill_seconds: float = 0.0
    prefill_tokens: int = 0  # prompt tokens computed (the prefix cache's excluded)
    decode_seconds: float = 0.0
    decode_tokens: int = 0  # tokens sampled
    decode_steps: int = 0  # decode forward passes
    decode_rows: int = 0  # rows of those passes, summed

    def prefill(self, seconds: float, tokens: int) -> None:
        self.prefill_seconds += seconds
        self.prefill_tokens += tokens

    def decode(self, seconds: float, tokens: int, rows: int) -> None:
        """One decode step: `tokens` sampled, then a forward pass over `rows` (0: none, the batch ended)."""
        self.decode_seconds += seconds
        self.decode_tokens += tokens
        self.decode_steps += rows > 0
        self.decode_rows += rows

    def record_request(self, prompt_tokens: int, completion_tokens: int, aborted: bool, e2e_latency: float,
                       cached_tokens: int = 0) -> None:
        self.prompt_tokens_total += prompt_tokens
        self.cached_tokens_total += cached_tokens
        self.generation_tokens_total += completion_tokens
        self.num_requests_total += 1
        self.num_aborted_requests_total += int(aborted)
        self.e2e_sum += e2e_latency
        self.e2e_count += 1
        self.e2e_counts[bisect.bisect_left(E2E_BUCKETS, e2e_latency)] += 1

    def batch_started(self, size: int) -> None:
        self.batch_sizes.append(size)
        self.busy_since = time.monotonic()

    def batch_joined(self, size: int) -> None:
        """Requests that joined a running batch between steps (late arrivals)."""
        self.joins.append(size)

    def record_batch(self, tokens: int, seconds: float) -> None:
        """Generation throughput: tokens over decoding time of the last few batches."""
        self.batches.append((tokens, seconds))
        total_s = sum(s for _, s in self.batches)
        self.last_gen_throughput = sum(t for t, _ in self.batches) / total_s if total_s > 0 else 0.0
        if self.busy_since is not None:
            self.busy_seconds_done += time.monotonic() - self.busy_since
            self.busy_since = None

    def busy_seconds(self) -> float:
        """Cumulative seconds the scheduler has spent running batches, the running one included:
        the difference of two readings over the wall time between them is the busy fraction."""
        return self.busy_seconds_done + (time.monotonic() - self.busy_since if self.busy_since is not None else 0.0)

    def snapshot(self) -> dict:
        cumulative, running = [], 0
        for bound, count in zip((*E2E_BUCKETS, float("inf")), self.e2e_counts):
            running += count
            cumulative.append((bound, running))
        return {"prompt_tokens_total": self.prompt_tokens_total,
                "generation_tokens_total": self.generation_tokens_total,
                "cached_tokens_total": self.cached_tokens_total,
                "num_requests_total": self.num_requests_total,
                "num_aborted_requests_total": self.num_aborted_requests_total,
                "gen_throughput": self.last_gen_throughput,
                "busy_seconds_total": self.busy_seconds(),
                "prefill_seconds_total": self.prefill_seconds, "prefill_tokens_total": self.prefill_tokens,
                "decode_seconds_total": self.decode_seconds, "decode_tokens_total": self.decode_tokens,
                "decode_steps_total": self.decode_steps, "decode_rows_total": self.decode_rows,
                "recent_batch_sizes": list(self.batch_sizes),
                "recent_joins": list(self.joins),
                "e2e_latency": {"buckets": cumulative, "sum": self.e2e_sum, "count": self.e2e_count}}
