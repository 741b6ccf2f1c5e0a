"""The metrics of one trainer step, as a row of the run's `metrics.jsonl`, and the log they go to.

Keys are namespaced: `train/…` (the learner's losses and diagnostics), `reward/…`, `time/…` (the
phase times: sampling wait, training, weight sync), `rollout/…` (counters of the rollout and the
buffer), `watchdog/…`. Belongs here: naming and writing the figures; computing them belongs to the
parts that own them.
"""

from __future__ import annotations

import json
from pathlib import Path


class MetricsLog:
    """Appends one JSON object per line; readable while the run goes on."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def append(self, row: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(row, default=float) + "\n")


def step_row(*, step: int, version: int, metrics: dict, stats: dict, wait_s: float, train_s: float, sync_s: float,
             elapsed: float, controller, buffer, watchdog, trained_tokens: int) -> dict:
    """One step's row: the learner's `metrics`, the batch's reward `stats`, the phase times and the
    rollout's counters; `trained_tokens` is the run's total so far (goodput = trained / generated)."""
    c = controller.counters
    generated = c.get("tokens_generated", 0)
    return {"step": step, "version": version, "elapsed_s": round(elapsed, 2),
            **{f"train/{k}": v for k, v in metrics.items()}, **stats,
            "time/sampling_wait_s": round(wait_s, 3), "time/train_s": round(train_s, 3), "time/sync_s": round(sync_s, 3),
            "rollout/tokens_generated": generated, "rollout/in_flight": controller.in_flight,
            "rollout/buffer_fill": len(buffer), "rollout/dropped_stale": buffer.counters["dropped_stale"],
            "rollout/backpressure_waits": c.get("backpressure_waits", 0),
            "rollout/env_failures": c.get("termination_error", 0) + c.get("termination_timeout", 0),
            "rollout/episode_errors": c.get("episode_errors", 0),
            **{f"rollout/{k}": c.get(k, 0) for k in ("aborted_generations", "resumed_generations", "wasted_tokens",
                                                      "server_retries", "weight_resyncs")},
            "rollout/infra_errors": c.get("termination_infra_error", 0),
            "watchdog/stuck_now": len(watchdog.stuck()), **watchdog.report(),
            "rollout/goodput": round(trained_tokens / generated, 4) if generated else None,
            "train/mismatch_kl": metrics.get("mismatch_kl")}
