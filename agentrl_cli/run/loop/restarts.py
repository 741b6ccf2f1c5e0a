"""What counts as a trainer crash, what caused it, and the record of a restart (`training.max_restarts`).

A trainer crash is the trainer failing under a run whose rollout and data are fine: a rank killed
or gone (`TrainerRanksFailed`), the trainer out of memory, a rank that stopped answering within its
deadline, or the train step raising (`TrainerCrashed`, raised by the step loop around
`backend.train_step`). The run (`run/training_run.py`) restarts from its latest complete checkpoint after one;
anything else (a bad config, a harness over its error budget, a rollout that produced nothing)
would fail the same way again and ends the run.

Belongs here: classifying an exception, the restart row of metrics.jsonl, the error that ends a
run whose restarts are spent. Not here: restarting (`run/training_run.py`, `run/attempts.py`), what a checkpoint holds
(`checkpoints.py`).
"""

from __future__ import annotations

from agentrl_cli.core.errors import AgentrlError
from agentrl_cli.runtime.observe import keys

ERROR_CHARS = 500  # of a crash's message in its restart row


class TrainerCrashed(AgentrlError):
    """The trainer's step raised (its cause is `__cause__`)."""

    exit_code = 1


class TrainerRestartsExhausted(AgentrlError):
    """The trainer crashed again after `training.max_restarts` restarts."""

    exit_code = 1


def crash_cause(exc: BaseException) -> str | None:
    """The kind of trainer crash `exc` is (rank_died, out_of_memory, hang, error), None when it is not one."""
    from agentrl_cli.learner.ranks_backend import TrainerRanksFailed

    chain, seen = [], exc
    while seen is not None and len(chain) < 8:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    if not any(isinstance(e, (TrainerCrashed, TrainerRanksFailed)) or _oom(e) for e in chain):
        return None
    if any(_oom(e) for e in chain):
        return "out_of_memory"
    ranks = next((e for e in chain if isinstance(e, TrainerRanksFailed)), None)
    if ranks is not None:
        return "hang" if "did not answer" in ranks.message else "rank_died"
    return "error"


def _oom(exc: BaseException) -> bool:
    import torch

    return isinstance(exc, torch.OutOfMemoryError) or (isinstance(exc, (RuntimeError, MemoryError))
                                                       and ("out of memory" in str(exc).lower() or isinstance(exc, MemoryError)))


def describe(exc: BaseException) -> str:
    """The crash's message: the step loop's wrapper names the step, its cause says what failed."""
    parts = [str(exc).splitlines()[0] if str(exc) else type(exc).__name__]
    if exc.__cause__ is not None:
        parts.append(f"{type(exc.__cause__).__name__}: {exc.__cause__}")
    return ": ".join(parts)[:ERROR_CHARS]


def restart_row(n: int, cause: str, exc: BaseException, last_step: int, checkpoint: str | None) -> dict:
    """The metrics.jsonl row of restart `n` (1-based)."""
    return {keys.EVENT: keys.TRAINER_RESTART, keys.TRAINER_RESTARTS: n, keys.RESTART_CAUSE: cause,
            keys.RESTART_ERROR: describe(exc), keys.RESTART_LAST_STEP: last_step, keys.RESTART_FROM: checkpoint}


def exhausted(restarts: list[dict], cause: str, exc: BaseException, max_restarts: int) -> TrainerRestartsExhausted:
    causes = ", ".join(r[keys.RESTART_CAUSE] for r in restarts) or "none"
    return TrainerRestartsExhausted(
        f"the trainer crashed ({cause}: {describe(exc)}) after {len(restarts)} restart(s), the most "
        f"training.max_restarts={max_restarts} allows (earlier causes: {causes})",
        "see the trainer's log (<run>/logs/, trainer-ranks.log with several ranks) for the crash; out_of_memory: lower "
        "training.micro_batch_size or set training.max_tokens_per_micro_batch; rank_died or hang: check the host "
        "(`agentrl stage run 8 --phase smoke`); rerun the same command to resume from the latest checkpoint")
