"""The metrics of one trainer step, as a row of the run's `metrics.jsonl`, and the one path they take:
`MetricsLog.append(row)` writes the row to the JSONL log and hands it to the exporters the config
turns on (a Prometheus endpoint while the run is live, TensorBoard event files).

Keys are namespaced: `train/…` (the learner's losses and diagnostics), `reward/…`, `time/…` (the
phase times: sampling wait, training, weight sync, and their shares of the step), `sync/…` (weight
sync), `rollout/…` (counters of the rollout and the buffer), `infer/…` (generation totals),
`env/<harness>/…` (service levels, from `HarnessStats`), `system/…` (CPU, RSS, accelerators),
`watchdog/…`. Belongs here: naming and writing the figures; computing them belongs to the parts that
own them.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

log = logging.getLogger(__name__)


class MetricsLog:
    """Appends one JSON object per line (readable while the run goes on) and feeds the exporters.

    `observe` is the config's ObserveConfig (None: the JSONL log alone); event files go to
    `<directory of the log>/tensorboard/`."""

    def __init__(self, path: Path, observe=None, *, run_id: str = "") -> None:
        from agentrl_cli.observe.system import SystemSampler

        self.path = Path(path)
        self.exporters: list = []
        self.system = SystemSampler()
        if observe is not None and observe.prometheus_port is not None:
            from agentrl_cli.observe.prometheus import PrometheusExporter

            self.exporters.append(PrometheusExporter(observe.prometheus_port, observe.prometheus_addr, run_id))
        if observe is not None and observe.tensorboard:
            from agentrl_cli.observe.tensorboard import TensorBoardExporter

            self.exporters.append(TensorBoardExporter(self.path.parent / "tensorboard"))

    def append(self, row: dict) -> None:
        row = {**row, **self.system.sample()}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(json.dumps(row, default=float) + "\n")
        for exporter in self.exporters:
            try:
                exporter.update(row)
            except Exception:  # noqa: BLE001 - an exporter's trouble must not end the run; the JSONL log has the row
                log.exception("exporting metrics through %s failed", type(exporter).__name__)

    def close(self) -> None:
        for exporter in self.exporters:
            try:
                exporter.close()
            except Exception:  # noqa: BLE001 - closing at the end of a run; the run's own outcome matters more
                log.exception("closing %s failed", type(exporter).__name__)
        self.exporters = []
        self.system.close()


def read_rows(path: Path) -> list[dict]:
    """The rows of a metrics log; a torn last line (a run still writing, or killed) is skipped."""
    rows = []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return rows
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def _share(part: float, total: float) -> float | None:
    return round(part / total, 4) if total > 0 else None


def step_row(*, step: int, version: int, metrics: dict, stats: dict, wait_s: float, train_s: float, sync_s: float,
             elapsed: float, controller, buffer, watchdog, trained_tokens: int) -> dict:
    """One step's row: the learner's `metrics`, the batch's reward `stats`, the phase times and the
    rollout's counters; `trained_tokens` is the run's total so far (goodput = trained / generated)."""
    c = controller.counters
    timers = getattr(controller, "timers", {}) or {}
    generated = c.get("tokens_generated", 0)
    step_s = wait_s + train_s + sync_s
    return {"step": step, "version": version, "elapsed_s": round(elapsed, 2),
            **{f"train/{k}": v for k, v in metrics.items()}, **stats,
            "time/sampling_wait_s": round(wait_s, 3), "time/train_s": round(train_s, 3), "time/sync_s": round(sync_s, 3),
            "time/sampling_share": _share(wait_s, step_s), "time/train_share": _share(train_s, step_s),
            "time/sync_share": _share(sync_s, step_s),
            "sync/seconds": round(sync_s, 3), "sync/weight_version": version,
            "rollout/tokens_generated": generated, "rollout/in_flight": controller.in_flight,
            "rollout/buffer_fill": len(buffer), "rollout/buffer_capacity": getattr(buffer, "capacity", None),
            "rollout/queue_length": controller.in_flight + len(buffer),
            "rollout/dropped_stale": buffer.counters["dropped_stale"],
            "rollout/backpressure_waits": c.get("backpressure_waits", 0),
            "rollout/env_failures": c.get("termination_error", 0) + c.get("termination_timeout", 0),
            "rollout/episode_errors": c.get("episode_errors", 0),
            **{f"rollout/{k}": c.get(k, 0) for k in ("aborted_generations", "resumed_generations", "wasted_tokens",
                                                      "server_retries", "weight_resyncs")},
            "rollout/infra_errors": c.get("termination_infra_error", 0),
            "infer/generate_s_total": round(timers.get("generate_s", 0.0), 3),
            "infer/env_s_total": round(timers.get("env_s", 0.0), 3),
            "watchdog/stuck_now": len(watchdog.stuck()), **watchdog.report(),
            "rollout/goodput": round(trained_tokens / generated, 4) if generated else None,
            "train/mismatch_kl": metrics.get("mismatch_kl")}
