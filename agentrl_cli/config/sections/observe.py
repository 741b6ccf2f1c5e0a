"""`observe`: metrics, trackers, traces, logs and health checks of a run. One module per section; `agentrl_cli/config/models.py` joins them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from agentrl_cli.config.sections.base import (Section)


class ObserveConfig(Section):
    runs_dir: str = Field("runs", description="Where run directories (reports, metrics, checkpoints) are created")
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="Level of agentrl's own loggers (and uvicorn's) in every process a run starts: this one, its inference servers (SGLang's --log-level), its trainer ranks and services; other libraries log warnings and above (at error, errors only)")
    log_max_mb: float = Field(100.0, gt=0, le=1_000_000, description="A log file of a run (<run dir>/…/logs/: agentrl.log, each server's and the trainer ranks' output) is rotated when it passes this size (MB)")
    log_backups: int = Field(3, ge=0, le=1000, description="Rotated files kept per log (NAME.log.1 is the newest); a log then takes at most log_max_mb × (1 + log_backups) MB, the oldest dropped first")
    prometheus_port: int | None = Field(None, ge=1, le=65535, description="Serve a live run's metrics for Prometheus on this port (None = off)")
    prometheus_addr: str = Field("127.0.0.1", description="Address the Prometheus endpoint binds (0.0.0.0 lets a Prometheus server on another host scrape it)")
    tensorboard: bool = Field(False, description="Also write TensorBoard event files (<run dir>/…/tensorboard/); the same as listing tensorboard in observe.trackers")
    trackers: list[Literal["tensorboard", "wandb", "mlflow"]] = Field(default_factory=list, description="Where else every row of metrics.jsonl goes, with the same metric names and steps, plus the resolved config (secrets masked) and the run's metadata: tensorboard (event files beside metrics.jsonl), wandb (offline files under <run dir>/wandb/ unless WANDB_MODE says otherwise; `wandb sync` uploads them), mlflow (the store observe.mlflow_uri names); needs pip install 'agentrl-cli[trackers]'")
    tracker_project: str = Field("agentrl", min_length=1, description="W&B project and MLflow experiment the runs are logged under (observe.trackers)")
    mlflow_uri: str = Field("", description="MLflow tracking URI (observe.trackers: mlflow): sqlite:///PATH, postgresql://..., http://HOST:PORT of an MLflow server; empty for sqlite:///<observe.runs_dir>/mlflow.db, one store for every run (`mlflow ui --backend-store-uri` it)")
    traces: str = Field("", description="OpenTelemetry spans (OTLP JSON, one ExportTraceServiceRequest per line) appended to this file (relative to the working directory, like observe.runs_dir): one trace per episode (model calls, tool calls and the reward as children; the trajectory id an attribute) and one per train step; empty = off")
    audit_log: str = Field("", description="Where services append audit lines (JSON: time, key id, endpoint, outcome) for sandbox executions, control-plane writes, weight updates and refused requests: a file, - for stderr (a pod's log), empty for <observe.runs_dir>/audit.jsonl")
    health_interval_s: float = Field(2.0, ge=0, le=3600, description="Seconds between the run's health checks of its inference servers, gateway, reward and sandbox services (the supervisor: restarts what the run started, takes what is down out of rotation); 0 = no supervisor")
    # alert thresholds: `agentrl observe alerts` renders them as Prometheus rules and `agentrl troubleshoot --run`
    # applies the same rules to metrics.jsonl (agentrl_cli/acceptance/alerts.py)
    alert_window_minutes: float = Field(15.0, gt=0, le=10_080, description="The window every alert rule looks back over (Prometheus range [Nm]; the last N minutes of a run's rows in troubleshoot --run)")
    alert_create_failures: int = Field(5, ge=0, le=1_000_000, description="Alert when a harness's environment creations fail more than this many times within the window")
    alert_peak_memory_mb: float = Field(2048.0, gt=0, le=10_000_000, description="Alert when an episode's sandbox peaks above this much memory (MiB) within the window")
    alert_memory_creep_mb_per_hour: float = Field(512.0, gt=0, le=10_000_000, description="Alert when the sandboxes' per-episode peak memory rises faster than this (MiB per hour, linear fit over the window)")
    alert_sampling_share: float = Field(0.7, gt=0, le=1, description="Alert when the trainer spends more than this share of its steps waiting for rollouts (mean over the window)")
    alert_sync_share: float = Field(0.3, gt=0, le=1, description="Alert when weight sync takes more than this share of the trainer's steps (mean over the window)")
