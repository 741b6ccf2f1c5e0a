"""Proving the platform works: the runbook and its stage context, verify, troubleshoot, evaluation,
select, chaos, the readers of a finished run directory (record, data, report, plots, alerts) and
creating a run directory. Imports any wing below it; nothing below imports it."""
