"""The metrics of one trainer step, as a row of the run's `metrics.jsonl`, and the one path they take:
`MetricsLog.append(row)` writes the row to the JSONL log and hands it to the exporters the config
turns on (a Prometheus endpoint while the run is live; the trackers of `observe.trackers`:
TensorBoard, W&B, MLflow, `trackers.py`). While it is open, the log also keeps the run's log files
in bounds (`logstreams.RunLogs`: `logs/` beside it, `observe.log_max_mb`).

The keys are named in `keys.py` (namespaced: `train/…`, `reward/…`, `time/…`, `sync/…`, `rollout/…`,
`infer/…`, `env/<harness>/…`, `system/…`, `watchdog/…`). Belongs here: writing the figures;
computing them belongs to the parts that own them.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from agentrl_cli.runtime.observe import keys as k

log = logging.getLogger(__name__)


class MetricsLog:
    """Appends one JSON object per line (readable while the run goes on) and feeds the exporters.

    `observe` is the config's ObserveConfig (None: the JSONL log alone); event files go to
    `<directory of the log>/tensorboard/`."""

    def __init__(self, path: Path, observe=None, *, run_id: str = "", config=None) -> None:
        """`config`: the whole PlatformConfig, which trackers record when no meta.json is beside the log."""
        from agentrl_cli.core.redaction import current
        from agentrl_cli.runtime.observe.system import SystemSampler

        self.path = Path(path)
        self.redactor = current()  # a row's strings (error kinds, names) may quote what a harness said
        self.exporters: list = []
        self.trackers = None  # trackers.TrackerFanout, when observe.trackers (or observe.tensorboard) asks for one
        self.logs = None  # logstreams.RunLogs over <dir>/logs/
        self.system = SystemSampler()
        if observe is None:
            return
        try:
            if observe.prometheus_port is not None:
                from agentrl_cli.runtime.observe.prometheus import PrometheusExporter

                self.exporters.append(PrometheusExporter(observe.prometheus_port, observe.prometheus_addr, run_id))
            from agentrl_cli.runtime.observe.tracker_setup import open_trackers
            from agentrl_cli.runtime.observe.trackers import TrackerFanout

            opened = open_trackers(observe, self.path.parent, run_id, config)
            if opened:
                self.trackers = TrackerFanout(opened)
                self.exporters.append(self.trackers)
            from agentrl_cli.core.logstreams import RunLogs

            self.logs = RunLogs(self.path.parent / "logs", observe.log_max_mb, observe.log_backups).start()
        except BaseException:
            self.close()
            raise

    def append(self, row: dict) -> None:
        row = {**row, **self.system.sample()}
        if self.trackers is not None:  # failures so far, once there are any
            row.update({k.tracker_errors(name): n for name, n in self.trackers.errors.items() if n})
        row = self.redactor.strings(row)
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
        self.exporters, self.trackers = [], None
        self.system.close()
        if self.logs is not None:
            self.logs.close()
            self.logs = None


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
    return {k.STEP: step, k.VERSION: version, k.ELAPSED_S: round(elapsed, 2),
            **{f"train/{name}": v for name, v in metrics.items()}, **stats,
            k.TIME_SAMPLING_WAIT_S: round(wait_s, 3), k.TIME_TRAIN_S: round(train_s, 3), k.TIME_SYNC_S: round(sync_s, 3),
            k.time_share("sampling"): _share(wait_s, step_s), k.time_share("train"): _share(train_s, step_s),
            k.time_share("sync"): _share(sync_s, step_s),
            k.SYNC_SECONDS: round(sync_s, 3), k.SYNC_WEIGHT_VERSION: version,
            k.ROLLOUT_TOKENS_GENERATED: generated, k.ROLLOUT_IN_FLIGHT: controller.in_flight,
            k.ROLLOUT_BUFFER_FILL: len(buffer), k.ROLLOUT_BUFFER_CAPACITY: getattr(buffer, "capacity", None),
            k.ROLLOUT_QUEUE_LENGTH: controller.in_flight + len(buffer),
            k.ROLLOUT_DROPPED_STALE: buffer.counters["dropped_stale"],
            k.ROLLOUT_BACKPRESSURE_WAITS: c.get("backpressure_waits", 0),
            k.ROLLOUT_ENV_FAILURES: c.get("termination_error", 0) + c.get("termination_timeout", 0),
            k.ROLLOUT_EPISODE_ERRORS: c.get("episode_errors", 0),
            **{k.rollout(name): c.get(name, 0) for name in k.ROLLOUT_COUNTERS},
            k.ROLLOUT_INFRA_ERRORS: c.get("termination_infra_error", 0),
            k.INFER_GENERATE_S_TOTAL: round(timers.get("generate_s", 0.0), 3),
            k.INFER_ENV_S_TOTAL: round(timers.get("env_s", 0.0), 3),
            k.WATCHDOG_STUCK_NOW: len(watchdog.stuck()), **watchdog.report(),
            k.ROLLOUT_GOODPUT: round(trained_tokens / generated, 4) if generated else None,
            k.TRAIN_MISMATCH_KL: metrics.get("mismatch_kl")}
