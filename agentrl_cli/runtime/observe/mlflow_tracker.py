"""The run's metrics in an MLflow tracking store (`observe.trackers: [mlflow]`): the store
`observe.mlflow_uri` names, by default `sqlite:///<observe.runs_dir>/mlflow.db` (one store for every
run, artifacts beside it in `mlartifacts/`; `mlflow ui --backend-store-uri sqlite:///runs/mlflow.db`
shows them). MLflow's file store (`file:`) is in maintenance mode and refuses to start unless
MLFLOW_ALLOW_FILE_STORE=true.

One MLflow run per metrics log (a trainer restart opens another), named `<run id>/<log dir>`, in the
experiment `observe.tracker_project`: every metric at its step, the config flattened as params
(`rollout.concurrency`) and whole as the artifact `config.json`, the run's metadata as `meta.json`
and its scalar fields as tags `agentrl.<field>`. Closing marks the run FINISHED.
Belongs here: MLflow's calls; what goes in and when is `trackers.py`'s.
"""

from __future__ import annotations

import time
from pathlib import Path

from agentrl_cli.core.errors import ConfigError
from agentrl_cli.runtime.observe.trackers import INSTALL, flatten, missing_package, tracker_key

PARAMS_PER_BATCH, METRICS_PER_BATCH = 100, 1000  # MLflow's log_batch limits
MAX_PARAM, MAX_TAG = 6000, 5000  # characters kept of a param's and a tag's value (MLflow refuses longer)


def default_uri(runs_dir: str) -> str:
    """`sqlite:///<runs_dir>/mlflow.db`, absolute (MLflow resolves a relative one against its own cwd)."""
    root = Path(runs_dir).absolute()
    root.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{root / 'mlflow.db'}"


def _artifact_root(uri: str) -> str | None:
    """Where a new experiment keeps artifacts: beside a SQLite store; the server's choice otherwise."""
    if uri.startswith("sqlite:///"):
        return (Path(uri[len("sqlite:///"):]).parent / "mlartifacts").absolute().as_uri()
    return None


class MlflowTracker:
    name = "mlflow"

    def __init__(self, *, uri: str, experiment: str, run_name: str, config: dict, meta: dict) -> None:
        try:
            from mlflow.entities import Metric, Param, RunTag
            from mlflow.tracking import MlflowClient
        except ImportError as exc:
            raise missing_package("mlflow", "mlflow-skinny (with sqlalchemy and alembic for sqlite:)", exc) from exc
        self._metric = Metric
        try:
            self.client = MlflowClient(tracking_uri=uri)
            experiment_id = self._experiment(experiment, uri)
            tags = [RunTag(f"agentrl.{k}", _text(v)[:MAX_TAG]) for k, v in meta.items() if _scalar(v)]
            self.run_id = self.client.create_run(experiment_id, run_name=run_name, tags={t.key: t.value for t in tags}).info.run_id
            named = {tracker_key(k): v[:MAX_PARAM] for k, v in flatten(config).items()}  # one value per name
            params = [Param(k, v) for k, v in named.items()]
            for i in range(0, len(params), PARAMS_PER_BATCH):
                self.client.log_batch(self.run_id, params=params[i:i + PARAMS_PER_BATCH])
            self.client.log_dict(self.run_id, config, "config.json")
            self.client.log_dict(self.run_id, meta, "meta.json")
        except ConfigError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure to start is the store's: named with the cause and the fix
            raise ConfigError(f"observe.trackers: mlflow could not log to {uri}: {type(exc).__name__}: {str(exc)[:500]}",
                              "check observe.mlflow_uri (sqlite:///PATH, postgresql://..., an MLflow server's "
                              "http://HOST:PORT) and that the store is reachable and writable (sqlite: needs "
                              f"sqlalchemy and alembic: {INSTALL}), or remove mlflow from observe.trackers") from exc

    def _experiment(self, name: str, uri: str) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        try:
            return self.client.create_experiment(name, artifact_location=_artifact_root(uri))
        except Exception:  # noqa: BLE001 - another run created it meanwhile: use theirs, else re-raise
            found = self.client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id

    def log(self, step: int, metrics: dict[str, float]) -> None:
        now = int(time.time() * 1000)
        batch = [self._metric(key, value, now, step) for key, value in metrics.items()]
        for i in range(0, len(batch), METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=batch[i:i + METRICS_PER_BATCH])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def _scalar(value) -> bool:
    return isinstance(value, (str, int, float, bool)) or (isinstance(value, list) and all(isinstance(v, str) for v in value))


def _text(value) -> str:
    return " ".join(value) if isinstance(value, list) else str(value)
