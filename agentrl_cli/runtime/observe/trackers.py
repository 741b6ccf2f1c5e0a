"""The experiment trackers a run's metrics also go to (`observe.trackers`: tensorboard, wandb, mlflow;
`observe.tensorboard: true` is the same as listing tensorboard), behind one small interface, and the
one path rows take to them.

Every tracker receives what metrics.jsonl holds: each row's numeric values (booleans and text left
out, as TensorBoard always did) at the row's `step` (0 for a row without one), under the row's key.
A key with a character MLflow refuses in a name (`watchdog/stuck{server}`) has it replaced by `_` for
every tracker alike, so the three hold the same names (`tracker_key`); the keys of `keys.py` pass
unchanged. At the start each tracker also gets the resolved config, secrets masked as `agentrl
config show` masks them, and the run's metadata (`meta.json` of the run directory: command, config
hash, packages, host, seeds, harness versions).

A tracker that cannot start (its package missing, its store unusable) stops the run at the start with
a ConfigError naming it and the fix. Once running, the rows go to the trackers on one worker thread
(`TrackerFanout`): a tracker that fails or stalls never holds up the run; its failures are counted
(`observe/tracker_errors/<name>` in the following rows of metrics.jsonl) and logged, and closing waits
at most `CLOSE_TIMEOUT_S` for what is queued.

Belongs here: the interface, the naming, what the trackers record and the fan-out. Opening the
configured ones is `tracker_setup.py`'s; each tracker's own calls live in its module (`tensorboard.py`,
`wandb_tracker.py`, `mlflow_tracker.py`).
"""

from __future__ import annotations

import json
import logging
import queue
import re
import threading
from collections import Counter
from pathlib import Path
from typing import Protocol

from agentrl_cli.core.errors import ConfigError

log = logging.getLogger(__name__)
INSTALL = "pip install 'agentrl-cli[trackers]'"
NAMES = ("tensorboard", "wandb", "mlflow")
QUEUE_ROWS = 1024  # rows waiting for a stalled tracker before further rows are dropped (and counted)
CLOSE_TIMEOUT_S = 60.0
_BAD_KEY_CHARS = re.compile(r"[^\w./\- ]")  # MLflow's rule for names, less the colon (refused on Windows)
MAX_KEY = 250  # MLflow's longest name


class Tracker(Protocol):
    """One tracker: opened with the run's config and metadata, then fed (step, {name: value})."""

    name: str

    def log(self, step: int, metrics: dict[str, float]) -> None: ...

    def close(self) -> None: ...


def tracker_key(key: str) -> str:
    """The name a row key has in every tracker: the key, with characters MLflow refuses and empty or
    dot path segments replaced by `_` (a name must not read as another path)."""
    name = _BAD_KEY_CHARS.sub("_", key)
    parts = [p if p.strip(".") else "_" for p in name.split("/")]
    return "/".join(parts)[:MAX_KEY]


def scalars(row: dict) -> tuple[int, dict[str, float]]:
    """(the row's step, its numeric values by tracker name)."""
    step = int(row.get("step") or 0)
    values = {tracker_key(k): float(v) for k, v in row.items()
              if k != "step" and not isinstance(v, bool) and isinstance(v, (int, float))}
    return step, values


def enabled(observe) -> list[str]:
    """The trackers the config turns on, in `NAMES` order."""
    wanted = set(observe.trackers) | ({"tensorboard"} if observe.tensorboard else set())
    return [n for n in NAMES if n in wanted]


def run_context(log_dir: Path, run_id: str, config=None, observe=None) -> tuple[Path, dict, dict]:
    """(the run directory, the masked config, the run's metadata) for a metrics log in `log_dir`: the
    nearest `meta.json` at or up to three levels above it (stage 8 logs to `<run>/stage8/`) has both;
    without one, `config` (the PlatformConfig, when the caller has it) or the observe section alone."""
    from agentrl_cli.core.redaction import current

    redactor = current()
    for directory in [log_dir, *list(log_dir.parents)[:3]]:
        meta_path = directory / "meta.json"
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(meta, dict):
            resolved = meta.pop("config", None) or {}
            return directory, redactor.config(resolved), redactor.strings(meta)
    if config is not None:
        resolved = config.model_dump(mode="json")
    else:
        resolved = {"observe": observe.model_dump(mode="json")} if observe is not None else {}
    return log_dir, redactor.config(resolved), {"run_id": run_id}


def flatten(data, prefix: str = "") -> dict[str, str]:
    """A nested config as dotted keys (`rollout.concurrency`, `harnesses.0.name`) and text values."""
    if isinstance(data, dict):
        out: dict[str, str] = {}
        for key, value in data.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    if isinstance(data, list) and data and all(isinstance(v, (dict, list)) for v in data):
        out = {}
        for i, value in enumerate(data):
            out.update(flatten(value, f"{prefix}{i}."))
        return out
    return {prefix.rstrip("."): json.dumps(data) if isinstance(data, (list, dict)) else str(data)}


def missing_package(tracker: str, package: str, exc: BaseException) -> ConfigError:
    """The error of a tracker whose package is not installed."""
    return ConfigError(f"observe.trackers has {tracker}, but its package {package} is not installed here ({exc})",
                       f"{INSTALL}, or remove {tracker} from observe.trackers")


class TrackerFanout:
    """Hands each row to every tracker on one worker thread (`update` never waits on a tracker)."""

    _STOP = object()

    def __init__(self, trackers: list[Tracker]) -> None:
        self.trackers = list(trackers)
        self.errors: Counter = Counter()  # tracker name -> failed or dropped rows
        self._queue: queue.Queue = queue.Queue(maxsize=QUEUE_ROWS)
        self._thread = threading.Thread(target=self._work, name="trackers", daemon=True)
        self._thread.start()

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.trackers]

    def update(self, row: dict) -> None:
        try:
            self._queue.put_nowait(scalars(row))
        except queue.Full:
            for tracker in self.trackers:
                self._failed(tracker, "dropped a row: the tracker is more than %d rows behind" % QUEUE_ROWS)

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Deliver what is queued, close the trackers; give up after `timeout_s` (the thread is a daemon)."""
        try:
            self._queue.put(self._STOP, timeout=timeout_s)
        except queue.Full:
            pass
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.error("trackers %s did not finish within %.0f s; their last rows may be missing",
                      ", ".join(self.names), timeout_s)

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is self._STOP:
                break
            step, values = item
            for tracker in self.trackers:
                try:
                    tracker.log(step, values)
                except Exception as exc:  # noqa: BLE001 - a tracker's failure is counted and logged, never the run's
                    self._failed(tracker, f"{type(exc).__name__}: {exc}", exc)
        for tracker in self.trackers:
            try:
                tracker.close()
            except Exception as exc:  # noqa: BLE001 - the run's own outcome matters more than a tracker's close
                self._failed(tracker, f"closing: {type(exc).__name__}: {exc}", exc)

    def _failed(self, tracker: Tracker, what: str, exc: BaseException | None = None) -> None:
        self.errors[tracker.name] += 1
        n = self.errors[tracker.name]
        if n == 1:
            log.error("tracker %s failed (counted in observe/tracker_errors/%s): %s", tracker.name, tracker.name, what,
                      exc_info=exc)
        elif n % 100 == 0:
            log.error("tracker %s has failed %d times; the latest: %s", tracker.name, n, what)
