"""Opening the trackers `observe.trackers` turns on (see `trackers.py`) for one metrics log: each with
the run's masked config and metadata, named `<run id>/<log dir>`; a tracker that cannot start closes
the ones opened before it and raises its ConfigError.
Belongs here: choosing and opening; the trackers' calls are their modules', the fan-out `trackers.py`'s.
"""

from __future__ import annotations

import logging
from pathlib import Path

from agentrl_cli.runtime.observe.trackers import Tracker, enabled, run_context

log = logging.getLogger(__name__)


def open_trackers(observe, log_dir: Path, run_id: str, config=None) -> list[Tracker]:
    """The trackers `observe` turns on, opened for the metrics log in `log_dir` (ConfigError when one
    cannot start: the ones opened before it are closed)."""
    names = enabled(observe)
    if not names:
        return []
    run_dir, cfg, meta = run_context(log_dir, run_id, config, observe)
    label = run_id if run_dir == log_dir else f"{run_id}/{log_dir.relative_to(run_dir)}"
    opened: list[Tracker] = []
    try:
        for name in names:
            opened.append(_open(name, observe, log_dir, run_dir, label, run_id, cfg, meta))
    except BaseException:
        for tracker in opened:
            _close_quietly(tracker)
        raise
    return opened


def _open(name: str, observe, log_dir: Path, run_dir: Path, label: str, run_id: str, cfg: dict, meta: dict) -> Tracker:
    if name == "tensorboard":
        from agentrl_cli.runtime.observe.tensorboard import TensorBoardTracker

        return TensorBoardTracker(log_dir / "tensorboard", cfg, meta)
    if name == "wandb":
        from agentrl_cli.runtime.observe.wandb_tracker import WandbTracker

        return WandbTracker(project=observe.tracker_project, run_name=label, group=run_id, directory=run_dir,
                            config=cfg, meta=meta)
    from agentrl_cli.runtime.observe.mlflow_tracker import MlflowTracker, default_uri

    return MlflowTracker(uri=observe.mlflow_uri or default_uri(observe.runs_dir), experiment=observe.tracker_project,
                         run_name=label, config=cfg, meta=meta)


def _close_quietly(tracker: Tracker) -> None:
    try:
        tracker.close()
    except Exception:  # noqa: BLE001 - closing after a failed start; the start's error is the one to report
        log.exception("closing tracker %s failed", tracker.name)
