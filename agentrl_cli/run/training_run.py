"""One training run, wired: inference servers, the rollout controller, the trainer backend, the
weight publisher, checkpoints and the trajectory store, joined by the bounded buffer. This module
composes the rooms: `build.py` makes the parts (`parts.RunParts`), the step loop (`loop/steps.py`)
trains over them and the run's state (`parts.RunState`), `supervise/` watches them.

    async with training(cfg, run_dir, model_path, run_id="r1") as run:   # start ... close
        summary = await run.run(steps=20)
    summary = await train(cfg, run_dir, model_path, 20, run_id="r1")      # the same, in one call

Every step appends a row to the run's `metrics.jsonl` (losses, reward, phase times, counters);
every evaluation a row of `eval/<harness>/success_rate`. Resume picks the newest complete
checkpoint (`training.resume_from_latest`) and restores model, optimizer, step, weight version,
sampler position, RNGs, buffered and in-flight episodes and the ledger of trained draws
(`loop/checkpoints.py`, `loop/ledger.py`).

A trainer crash (a rank killed, out of memory, a train step that raised or stopped answering:
`loop/restarts.py`) restarts the run: `supervised` closes the crashed run and starts a new one that
resumes from the latest complete checkpoint (`attempts.py`), up to `training.max_restarts` times;
each restart is a row of metrics.jsonl with its cause, and the summary's `restarts`. `train`
(stage 8, verify's resume probe) and verify's own run are supervised.

Servers that die or hang: generations resume (`engines/resume.py`), a server back with its launch
weights gets the run's again (`weightsync/publisher.py`), a watchdog flags what is stuck past
`training.watchdog_seconds`, and the supervisor (`supervise/wiring.py`; `observe.health_interval_s`,
0 = none) restarts what the run started, takes what is down out of rotation and lets servers join
and leave (`agentrl run servers add|remove URL`).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import AsyncIterator, Awaitable, Callable, TypeVar

from agentrl_cli.core.outcomes import Phase
from agentrl_cli.learner.checkpoint import CheckpointManager
from agentrl_cli.run.attempts import next_attempt, whole_run
from agentrl_cli.run.build import PartsBuilder, close_parts
from agentrl_cli.run.loop.checkpoints import resume, reuse_stored
from agentrl_cli.run.loop.evaluation import evaluate
from agentrl_cli.run.loop.restarts import crash_cause
from agentrl_cli.run.loop.samples import SampleBuilder
from agentrl_cli.run.loop.steps import RunSummary, StepLoop, samples_per_step
from agentrl_cli.run.parts import RunParts, RunState, View, views
from agentrl_cli.runtime.observe.step_metrics import MetricsLog
from agentrl_cli.runtime.observe.watchdog import Watchdog

__all__ = ["RunSummary", "TrainingRun", "samples_per_step", "supervised", "train", "training"]
T = TypeVar("T")


class TrainingRun:
    """The parts of one run. `await start()`, `await run(steps)` (any number of times), `await close()`.
    `parts` (RunParts) is built whole by `start`; `state` (RunState) is what the loop changes; both
    read as the run's own attributes too (`run.client`, `run.step`), the state's writable."""

    servers, client, controller, sampler, buffer, writer, sandboxes, gateway, backend, publisher = views("parts", 10)
    metrics, watchdog, samples, ckpt = View("parts"), View("parts"), View("parts"), View("parts", "checkpoints")
    step, version, trained_tokens, ledger, resumed_from, restarts = views("state", 6, writable=True)
    step_rows, evals, checkpoints_written = views("state", 3, writable=True)

    def __init__(self, cfg, run_dir: Path, model_path: Path, *, run_id: str, phase: str = Phase.TRAIN,
                 progress: Callable[[str], None] = lambda msg: None, trainer: bool = True,
                 components: list | None = None, kept=None) -> None:
        """`trainer=False`: the rollout side only (servers, harnesses and their sandboxes, reward,
        store, controller), for playing episodes exactly as training does without training on them.
        `components`: more parts for the supervisor to watch (`agentrl_cli.run.supervise.Component`s, e.g.
        a `ProcessComponent` the caller made: started by the supervisor when not running yet, restarted
        like the run's own, stopped by the caller). `kept`: a `kept_servers.KeptServers` the run takes
        its inference servers from when it resumes from a checkpoint, and hands them to when it ends."""
        self.cfg, self.run_dir, self.model_path, self.run_id, self.phase = cfg, Path(run_dir), Path(model_path), run_id, phase
        self.with_trainer, self.progress = trainer, progress
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self.parts = RunParts(run_id=run_id, phase=phase, run_dir=self.run_dir, model_path=self.model_path,
                              metrics=MetricsLog(self.metrics_path, cfg.observe, run_id=run_id),
                              watchdog=Watchdog(cfg.training.watchdog_seconds),
                              checkpoints=CheckpointManager(self.run_dir / "checkpoints", cfg.training.keep_last_checkpoints),
                              samples=SampleBuilder(cfg), kept=kept)
        self.state = RunState()
        self.restarting = False  # started again after a crash: reuse the stored trajectories even with no checkpoint
        self.sandbox_leaks: dict = {}  # filled by close(): what outlived the run's sandbox pools
        self.components = list(components or [])
        self.supervision = None  # supervise.wiring.RunSupervision, when observe.health_interval_s > 0
        self.supervisor = None  # its Supervisor: the step loop raises its `failed`
        self.loop: StepLoop | None = None  # with a trainer, once started

    async def start(self) -> None:
        resumable = self.with_trainer and self.cfg.training.resume_from_latest
        latest = self.ckpt.latest() if resumable else None
        if self.parts.kept is not None and latest is None:  # at the launch weights: servers load them from disk
            self.parts.kept.close()
        builder = PartsBuilder(self.cfg, self.parts, trainer=self.with_trainer, progress=self.progress)
        try:
            await builder.build()
        finally:
            self.parts = builder.parts()  # whole, or what a start that failed halfway made (close() closes it)
        if self.with_trainer:
            if latest is not None:
                self.progress(f"resuming from {latest.name}")
                await resume(self.parts, self.state, latest)
            elif self.restarting:
                await reuse_stored(self.parts, self.state)
        if self.cfg.observe.health_interval_s > 0:  # the supervisor over the run's components (0: none)
            from agentrl_cli.run.supervise.wiring import RunSupervision

            self.supervision = RunSupervision(self.parts, self.state, self.cfg, self.components)
            self.supervisor = await self.supervision.start()
        if self.with_trainer:
            cfg = self.cfg
            self.loop = StepLoop(self.parts, self.state, cfg.rollout, cfg.training, cfg.observe, supervisor=self.supervisor)

    async def run(self, steps: int, *, deadline_s: float | None = None, eval_tasks: dict | None = None,
                  eval_every: int | None = None, on_step: Callable[[dict], None] = lambda row: None) -> RunSummary:
        """Train until step `steps` (or `deadline_s` seconds); evaluate `eval_tasks` (harness -> tasks)
        before, every `eval_every` steps and at the end."""
        return await self.loop.run_steps(steps, deadline_s=deadline_s, eval_tasks=eval_tasks, eval_every=eval_every,
                                         on_step=on_step)

    async def evaluate(self, eval_tasks: dict) -> dict:
        """One evaluation of `eval_tasks` (harness -> tasks) at the current step (`loop/evaluation.py`)."""
        return await evaluate(self.parts, self.state, eval_tasks, concurrency=self.cfg.rollout.eval_concurrency)

    async def close(self) -> None:
        if self.supervision is not None:  # first: what is stopped below must not be restarted
            await self.supervision.stop()
        self.metrics.close()
        self.watchdog.stop()
        self.sandbox_leaks = await close_parts(self.parts)

    async def __aenter__(self) -> "TrainingRun":
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


@contextlib.asynccontextmanager
async def training(cfg, run_dir: Path, model_path: Path, *, run_id: str, phase: str = Phase.TRAIN,
                   progress: Callable[[str], None] = lambda msg: None, trainer: bool = True,
                   components: list | None = None) -> AsyncIterator[TrainingRun]:
    """A started run, closed on the way out whatever happens inside (`trainer`, `components`: as TrainingRun)."""
    run = TrainingRun(cfg, run_dir, model_path, run_id=run_id, phase=phase, progress=progress, trainer=trainer,
                      components=components)
    try:
        await run.start()
        yield run
    finally:
        await run.close()


async def supervised(cfg, run_dir: Path, model_path: Path, body: Callable[[TrainingRun], Awaitable[T]], *, run_id: str,
                     phase: str = Phase.TRAIN, progress: Callable[[str], None] = lambda msg: None,
                     crashed: list[TrainingRun] | None = None, components: list | None = None, kept=None) -> T:
    """`await body(run)` on a started run, closed on the way out; after a trainer crash, again on a new
    run resumed from the latest complete checkpoint, up to `training.max_restarts` times (then
    `TrainerRestartsExhausted`, naming the cause). `body` must continue to its goal from the run's
    step (as `TrainingRun.run` does). The crashed runs are appended to `crashed`; `components`: as
    TrainingRun's, for every attempt; `kept`: as TrainingRun's (an attempt resumed after a crash takes
    the servers the crashed one kept). A component the supervisor gave up on (`ComponentFailed`) is no
    trainer crash: it ends the run."""
    crashed = [] if crashed is None else crashed
    restarts: list[dict] = []  # the restart rows so far; the last one goes into the next attempt's metrics
    attempt = cfg
    while True:
        run = TrainingRun(attempt, run_dir, model_path, run_id=run_id, phase=phase, progress=progress, components=components,
                          kept=kept)
        run.restarts, run.restarting = len(restarts), bool(restarts)
        if restarts:
            run.metrics.append(restarts[-1])
        try:
            try:
                await run.start()
                result = await body(run)
            finally:
                await run.close()
            if isinstance(result, RunSummary):
                result.restarts = list(restarts)
            return result
        except Exception as exc:
            cause = crash_cause(exc)
            if cause is None:
                raise
            crashed.append(run)
            attempt = next_attempt(cfg, crashed, restarts, cause, exc, progress)


async def train(cfg, run_dir: Path, model_path: Path, steps: int, *, run_id: str, phase: str = Phase.TRAIN,
                progress: Callable[[str], None] = lambda msg: None, components: list | None = None, kept=None,
                **run_options) -> RunSummary:
    """Start a run, train to step `steps` (`run_options` as `TrainingRun.run`), close it, restarting
    after a trainer crash (`supervised`). The summary covers the whole run: the steps and evaluations
    of crashed attempts up to the checkpoint the next resumed from, and the restarts; its counters
    include what outlived the last attempt's sandbox pools. `kept`: as TrainingRun's."""
    crashed: list[TrainingRun] = []
    last: list[TrainingRun] = []

    async def body(run: TrainingRun) -> RunSummary:
        last.append(run)
        return await run.run(steps, **run_options)
    summary = await supervised(cfg, run_dir, model_path, body, run_id=run_id, phase=phase, progress=progress, crashed=crashed,
                               components=components, kept=kept)
    return whole_run(summary, crashed, last[-1])
