"""Observing a run: the metrics path (`step_metrics`: the JSONL log and its exporters, `prometheus`,
`tensorboard`, `system`), per-harness service levels (`harness_stats`), the watchdog that names stuck
components, progress of long work on stderr (`progress`), and the HTML run report (`run_data`,
`plots`, `run_report`). Nothing here drives the run."""
