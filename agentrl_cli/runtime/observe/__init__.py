"""Observing a run: the names of its metrics (`keys`), the metrics path (`step_metrics`: the JSONL log
and its exporters, `prometheus`, `system`; the trackers of observe.trackers: `trackers`, `tracker_setup`,
`tensorboard`, `wandb_tracker`, `mlflow_tracker`), OpenTelemetry spans (`traces`), per-harness service levels
(`harness_stats`), the watchdog that names stuck components, progress of long work on stderr
(`progress`), the one reader of what a run recorded (`run_record`, which verify and troubleshoot
read too), the HTML run report (`run_data`, `plots`, `run_report`), and the redaction of secrets from
everything a process logs, prints and reports (`redaction`). Nothing here drives the run."""
