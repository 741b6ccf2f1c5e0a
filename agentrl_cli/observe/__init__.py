"""Observing a run: the watchdog that names stuck components. Metrics writers, phase timers and
exporters belong here too; nothing here drives the run."""
