"""Counters the embedded engine keeps for `/metrics` and `/server_info`. Plain numbers, no
Prometheus types: the HTTP layer (`metrics.py`) turns a snapshot into SGLang-named metrics.
The engine updates an `EngineStats` under its own lock."""

from __future__ import annotations

import bisect
import time
from collections import deque
from dataclasses import dataclass, field

# SGLang's buckets for sglang:e2e_request_latency_seconds, with finer ones for small CPU models
E2E_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0,
               80.0, 100.0, 200.0, 400.0, 800.0)
THROUGHPUT_WINDOW_BATCHES = 16


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
                "recent_batch_sizes": list(self.batch_sizes),
                "recent_joins": list(self.joins),
                "e2e_latency": {"buckets": cumulative, "sum": self.e2e_sum, "count": self.e2e_count}}
