"""Trackers that fail: a missing package or an unusable store stops the run at the start with an error
naming the tracker and the fix; a store that fails mid-run is counted in the next rows of
metrics.jsonl (`observe/tracker_errors/<name>`) and logged, and a tracker that hangs never holds up
`append` or `close`. Stores are real (MLflow's sqlite store, W&B offline); only the hanging tracker is
a stand-in, because no real store hangs on demand."""

from __future__ import annotations

import json
import sys
import threading
import time

import pytest

from agentrl_cli.config import load_config
from agentrl_cli.core.errors import ConfigError
from agentrl_cli.runtime.observe import keys
from agentrl_cli.runtime.observe.step_metrics import MetricsLog, read_rows
from agentrl_cli.runtime.observe.trackers import INSTALL, QUEUE_ROWS, TrackerFanout, enabled, tracker_key

pytestmark = pytest.mark.integration


def observe(tmp_path, *sets: str):
    return load_config(None, [f"observe.runs_dir={tmp_path / 'runs'}", *sets], env={}).config.observe


def wait_for(predicate, what: str, deadline_s: float = 60.0) -> None:
    end = time.monotonic() + deadline_s
    while not predicate():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.parametrize("tracker, module", [("wandb", "wandb"), ("mlflow", "mlflow")])
def test_a_missing_package_is_an_error_at_the_start_with_the_install_command(tmp_path, monkeypatch, tracker, module):
    for name in [m for m in sys.modules if m == module or m.startswith(module + ".")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, module, None)  # `import wandb` raises ImportError, as without the package
    with pytest.raises(ConfigError) as err:
        MetricsLog(tmp_path / "run" / "metrics.jsonl", observe(tmp_path, f"observe.trackers=[tensorboard, {tracker}]"))
    assert f"observe.trackers has {tracker}" in err.value.message and INSTALL in err.value.hint


def test_an_unusable_mlflow_store_is_an_error_naming_it(tmp_path):
    (tmp_path / "not-a-dir").write_text("a file where the store's directory should be")
    uri = f"sqlite:///{tmp_path / 'not-a-dir' / 'mlflow.db'}"
    with pytest.raises(ConfigError) as err:
        MetricsLog(tmp_path / "run" / "metrics.jsonl", observe(tmp_path, "observe.trackers=[mlflow]", f"observe.mlflow_uri={uri}"))
    assert "mlflow could not log to" in err.value.message and uri in err.value.message
    assert "observe.mlflow_uri" in err.value.hint


def test_a_store_failing_mid_run_is_counted_in_the_next_rows_and_logged(tmp_path, caplog):
    metrics = MetricsLog(tmp_path / "run" / "metrics.jsonl", observe(tmp_path, "observe.trackers=[mlflow]"), run_id="r")
    try:
        [mlflow] = metrics.trackers.trackers
        metrics.append({"step": 1, "train/loss": 1.0})
        wait_for(lambda: mlflow.client.get_metric_history(mlflow.run_id, "train/loss"), "the first row in MLflow")
        mlflow.client.delete_run(mlflow.run_id)  # MLflow refuses metrics for a deleted run
        with caplog.at_level("ERROR", logger="agentrl_cli.runtime.observe.trackers"):
            metrics.append({"step": 2, "train/loss": 0.5})
            wait_for(lambda: metrics.trackers.errors["mlflow"] == 1, "the failed row to be counted")
        metrics.append({"step": 3, "train/loss": 0.25})
    finally:
        metrics.close()
    rows = read_rows(tmp_path / "run" / "metrics.jsonl")
    assert [r.get(keys.tracker_errors("mlflow")) for r in rows] == [None, None, 1]
    assert any("tracker mlflow failed" in m for m in caplog.messages)


class Stalled:
    """A tracker whose store does not answer until released."""

    name = "stalled"

    def __init__(self) -> None:
        self.release, self.entered = threading.Event(), threading.Event()
        self.logged = 0

    def log(self, step, metrics) -> None:
        self.entered.set()
        self.release.wait()
        self.logged += 1

    def close(self) -> None:
        self.release.wait()


def test_a_hanging_tracker_never_holds_up_the_run(tmp_path):
    stalled = Stalled()
    fanout = TrackerFanout([stalled])
    try:
        fanout.update({"step": 0, "train/loss": 1.0})
        assert stalled.entered.wait(30)  # the first row is in the tracker, which never answers
        for step in range(1, QUEUE_ROWS + 5):  # QUEUE_ROWS queued, the rest dropped
            fanout.update({"step": step, "train/loss": 1.0})
        assert fanout.errors["stalled"] == 4
        fanout.close(timeout_s=0.5)  # returns though the tracker never answers
        assert stalled.logged == 0
    finally:
        stalled.release.set()


def test_tensorboard_key_is_an_alias_of_listing_it(tmp_path):
    assert enabled(observe(tmp_path, "observe.tensorboard=true")) == ["tensorboard"]
    assert enabled(observe(tmp_path, "observe.tensorboard=true", "observe.trackers=[mlflow, tensorboard]")) == ["tensorboard", "mlflow"]
    assert enabled(observe(tmp_path)) == []


@pytest.mark.parametrize("key, name", [("train/loss", "train/loss"), ("watchdog/stuck{server:http://x}", "watchdog/stuck_server_http_/_/x_"),
                                        ("env/h/tool/../ok", "env/h/tool/_/ok")])
def test_tracker_names_are_the_row_keys_where_mlflow_allows_them(key, name):
    from mlflow.utils.validation import _validate_metric_name

    assert tracker_key(key) == name
    _validate_metric_name(tracker_key(key))  # MLflow's own rule: raises for a name it refuses


def test_wandb_offline_run_is_written_under_the_run_directory(tmp_path, monkeypatch):
    for var in ("WANDB_MODE", "WANDB_DIR"):
        monkeypatch.delenv(var, raising=False)
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home"))
    run_dir = tmp_path / "runs" / "r"
    (run_dir).mkdir(parents=True)
    (run_dir / "meta.json").write_text(json.dumps({"run_id": "r", "config": {"inference": {"api_key": "**********"}}}))
    metrics = MetricsLog(run_dir / "stage8" / "metrics.jsonl", observe(tmp_path, "observe.trackers=[wandb]"), run_id="r")
    metrics.append({"step": 1, "train/loss": 1.0})
    metrics.close()
    [offline] = list((run_dir / "wandb").glob("offline-run-*"))
    assert list(offline.glob("run-*.wandb"))
