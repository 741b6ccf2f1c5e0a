"""Between the attempts of a supervised run (`training_run.supervised`): after a trainer crash, the
checkpoint the next attempt resumes from, its config and its restart row; after the last attempt,
the summary of the whole run across the crashed ones.

The next attempt resumes from the newest complete checkpoint under the run directory; a run told
not to resume (`training.resume_from_latest: false`) resumes only from a checkpoint one of its own
attempts wrote, and starts again from step 0 when there is none (reusing what it stored).

Belongs here: what is carried from one attempt to the next. Not here: what counts as a crash and
the restart row's keys (`loop/restarts.py`), running an attempt (`training_run.py`).
"""

from __future__ import annotations

import logging
from typing import Callable

from agentrl_cli.config.load import with_overrides
from agentrl_cli.run.loop.restarts import describe, exhausted, restart_row
from agentrl_cli.run.loop.steps import RunSummary

log = logging.getLogger(__name__)


def next_attempt(cfg, crashed: list, restarts: list[dict], cause: str, exc: BaseException,
                 progress: Callable[[str], None]):
    """The config of the attempt after `crashed[-1]` (a TrainingRun) crashed with `exc` (of kind
    `cause`); appends its restart row to `restarts` (the next attempt writes it to metrics.jsonl).
    Raises TrainerRestartsExhausted past `training.max_restarts`."""
    run, most = crashed[-1], cfg.training.max_restarts
    if len(restarts) >= most:
        raise exhausted(restarts, cause, exc, most) from exc
    latest = run.ckpt.latest()
    written = {n for r in crashed for n in r.checkpoints_written}
    if latest is not None and not (cfg.training.resume_from_latest or latest.name in written):
        latest = None
    origin = latest.name if latest else None
    restarts.append(restart_row(len(restarts) + 1, cause, exc, run.step, origin))
    attempt = with_overrides(cfg, {"training.resume_from_latest": latest is not None}, "a trainer restart")
    log.error("the trainer crashed (%s) at step %d: %s; restart %d of %d from %s", cause, run.step, describe(exc),
              len(restarts), most, origin or "the start")
    progress(f"the trainer crashed ({cause}): restarting from {origin or 'the start'} "
             f"(restart {len(restarts)} of training.max_restarts={most})")
    return attempt


def whole_run(summary: RunSummary, crashed: list, last) -> RunSummary:
    """`summary` (of the `last` attempt) widened to the whole run: the steps and evaluations of the
    crashed attempts up to the checkpoint the next resumed from, and what outlived the last
    attempt's sandbox pools in its counters."""
    summary.counters.update(last.sandbox_leaks)
    if not crashed:
        return summary
    kept_rows, kept_evals = [], []
    for dead, after in zip(crashed, [*crashed[1:], last]):
        upto = resumed_step(after)
        kept_rows = [r for r in kept_rows if r["step"] <= upto] + [r for r in dead.step_rows if r["step"] <= upto]
        kept_evals = [e for e in kept_evals if e["step"] <= upto] + [e for e in dead.evals if e["step"] <= upto]
    summary.metrics = kept_rows + summary.metrics
    seen = {e["step"] for e in kept_evals}
    summary.evals = kept_evals + [e for e in summary.evals if e["step"] not in seen]
    summary.start_step, summary.resumed_from = resumed_step(crashed[0]), crashed[0].resumed_from
    return summary


def resumed_step(run) -> int:
    """The step `run` started at (from its checkpoint, else 0)."""
    return int(run.resumed_from.split("-")[1]) if run.resumed_from else 0
