"""Playing an evaluation's pending episodes through the training run's rollout side
(`run.training(..., trainer=False)`: inference servers, harnesses and their sandboxes, the reward,
the store), exactly as training plays them, at most `rollout.eval_concurrency` at once (0 = all).

Each finished episode goes to the trajectory store (phase `eval`, the evaluation id as run id) and
then, once the store has published it, to `results.jsonl` (`ResultSink`): a row in the results
always has its trajectory in the store, and what a kill loses is only episodes not yet recorded,
which a resume plays again. Publishing is batched: at most one store flush every FLUSH_INTERVAL_S.

An episode's trajectory id is `<eval id>-eval-t<task no>[r<attempt>]-<index>`: a replay in a later
attempt (a resume) never reuses an id, even for an episode whose trajectory reached the store just
before a kill kept its row from results.jsonl (that copy stays in the store, and only the rows say
which trajectories count).

An episode is an infrastructure error (row status `error`, played again on resume) when its
generation could not be finished, its environment not created, its harness's own code raised, its
reward could not be computed (`infra_error`), or playing it raised. Every other ending is a result.
The evaluation stops early when a harness keeps failing in its own code (`rollout.max_harness_errors`,
`HarnessFailed`) or the run's supervisor gives up on a component (`ComponentFailed`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Callable

from agentrl_cli.acceptance.evaluation.evaldir import EvalDir
from agentrl_cli.acceptance.evaluation.passk import ERROR, GREEDY, OK
from agentrl_cli.core.outcomes import Outcome, RewardStatus, Termination
from agentrl_cli.core.rundir import now_iso

log = logging.getLogger(__name__)
FLUSH_INTERVAL_S = 2.0


class ResultSink:
    """Finished episodes into the store, then their rows into results.jsonl, one batch at a time.
    Only this sink touches the run's writer while the evaluation plays (the writer holds no lock)."""

    def __init__(self, writer, evaldir: EvalDir, interval_s: float = FLUSH_INTERVAL_S) -> None:
        self.writer, self.evaldir, self.interval_s = writer, evaldir, interval_s
        self.pending: list[tuple[object, dict]] = []  # (record or None, row), not yet given to the writer
        self.unflushed: list[dict] = []  # rows whose records the writer holds, not yet published
        self.recorded = 0  # rows appended to results.jsonl
        self._wake, self._closing = asyncio.Event(), asyncio.Event()
        self._task: asyncio.Task | None = None
        self._warned = False

    def start(self) -> "ResultSink":
        self._task = asyncio.create_task(self._loop())
        return self

    def add(self, record, row: dict) -> None:
        self.pending.append((record, row))
        self._wake.set()

    async def _loop(self) -> None:
        """One commit per wake-up, at most one every interval_s; after close(), until nothing is left."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self._commit()
            except Exception as exc:  # noqa: BLE001 - retried at the next batch; the last one raises
                if self._closing.is_set():
                    raise
                if not self._warned:
                    log.warning("publishing evaluation episodes failed (retried): %s", exc)
                    self._warned = True
            if self._closing.is_set() and not self.pending and not self.unflushed:
                return
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._closing.wait(), self.interval_s)

    async def _commit(self) -> None:
        batch, self.pending = self.pending, []
        if batch or self.unflushed:
            await asyncio.to_thread(self._write, batch)

    def _write(self, batch: list[tuple[object, dict]]) -> None:
        failed = None
        for record, row in batch:
            if record is not None:
                try:
                    self.writer.write(record)  # buffered; a write that fills a file may raise, its row stays buffered
                except Exception as exc:  # noqa: BLE001 - the flush below raises what still fails
                    failed = failed or exc
            self.unflushed.append(row)
        self.writer.flush()
        rows, self.unflushed = self.unflushed, []
        self.evaldir.append(rows)
        self.recorded += len(rows)
        if failed is not None:
            log.warning("a trajectory write failed, then published with the flush: %s", failed)

    async def close(self) -> None:
        """Publish what is left, then stop (raises when the store still fails). The commit under
        way finishes first: the writer is never used from two threads at once."""
        self._closing.set()
        self._wake.set()
        if self._task is not None:
            await self._task


def group_id(episode: dict, attempt: int) -> str:
    return f"t{episode['task']:05d}" + (f"r{attempt}" if attempt else "")


async def play_episodes(run, evaldir: EvalDir, manifest: dict, episodes: list[dict], tasks: dict, *, attempt: int,
                        progress: Callable[[int, int], None] = lambda done, total: None) -> int:
    """Play `episodes` (planned episode dicts) of `manifest` on the started `run`; returns the rows
    recorded. `tasks`: task no -> TaskSpec."""
    from agentrl_cli.runtime.rollout.sampler import Draw
    from agentrl_cli.run.supervise.supervisor import unless_failed

    rows_of = {t["no"]: t for t in manifest["tasks"]}
    temperature = float(manifest["temperature"])
    n = run.cfg.rollout.eval_concurrency
    limit = asyncio.Semaphore(n) if n > 0 else contextlib.nullcontext()
    controller = run.controller
    done = 0

    async def one(ep: dict) -> None:
        nonlocal done
        async with limit:
            if controller.harness_errors.failed is not None:
                return  # the evaluation stops: the rest stay unplayed, for a resume
            task = tasks[ep["task"]]
            draw = Draw(task, group_id(ep, attempt), ep["index"], ep["seed"])
            try:
                result, scored, record = await controller.play(
                    draw, temperature=0.0 if ep["mode"] == GREEDY else temperature, store=False)
                row = result_row(ep, attempt, rows_of[ep["task"]], result, scored, record.trajectory_id)
            except Exception as exc:  # noqa: BLE001 - one episode's failure is its row, not the evaluation's end
                log.warning("evaluation episode %s failed: %s: %s", ep["key"], type(exc).__name__, exc)
                record, row = None, error_row(ep, attempt, rows_of[ep["task"]], f"{type(exc).__name__}: {exc}")
            sink.add(record, row)
            done += 1
            progress(done, len(episodes))

    sink = ResultSink(run.writer, evaldir).start()
    try:
        await unless_failed(getattr(run, "supervisor", None), asyncio.gather(*(one(ep) for ep in episodes)))
    finally:
        await sink.close()
    controller.harness_errors.raise_if_failed()
    return sink.recorded


def _base(ep: dict, attempt: int, task_row: dict) -> dict:
    return {"key": ep["key"], "attempt": attempt, "task": ep["task"], "harness": task_row["harness"],
            "task_id": task_row["task_id"], "family": task_row["family"], "mode": ep["mode"], "index": ep["index"],
            "seed": ep["seed"]}


def result_row(ep: dict, attempt: int, task_row: dict, result, scored, trajectory_id: str) -> dict:
    lost = result.termination == Termination.INFRA_ERROR or scored.status == RewardStatus.INFRA_ERROR
    return {**_base(ep, attempt, task_row), "status": ERROR if lost else OK, "success": scored.outcome == Outcome.SUCCESS,
            "reward": scored.reward, "outcome": str(scored.outcome), "termination": str(result.termination),
            "reward_status": str(scored.status), "turns": len(result.trajectory.actions),
            "completion_tokens": result.completion_tokens, "trajectory_id": trajectory_id,
            "error": (scored.detail or result.error) if lost else "", "at": now_iso()}


def error_row(ep: dict, attempt: int, task_row: dict, error: str) -> dict:
    return {**_base(ep, attempt, task_row), "status": ERROR, "success": False, "reward": None, "outcome": "",
            "termination": "", "reward_status": "", "turns": 0, "completion_tokens": 0, "trajectory_id": "",
            "error": error, "at": now_iso()}
