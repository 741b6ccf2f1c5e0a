"""One training run, wired: inference servers, the rollout controller, the trainer backend, the
weight publisher, checkpoints and the trajectory store, joined by the bounded buffer. This module
builds the parts and hands them to the step loop (`run/loop/steps.py`); each part lives in its room.

    async with training(cfg, run_dir, model_path, run_id="r1") as run:   # start ... close
        summary = await run.run(steps=20)
    summary = await train(cfg, run_dir, model_path, 20, run_id="r1")      # the same, in one call

Every step appends a row to the run's `metrics.jsonl` (losses, reward, phase times, counters);
every evaluation a row of `eval/<harness>/success_rate`. Resume picks the newest complete
checkpoint (`training.resume_from_latest`) and restores model, optimizer, step, weight version,
sampler position, RNGs, buffered and in-flight episodes and the ledger of trained draws
(`run/loop/checkpoints.py`, `run/loop/ledger.py`).

A trainer crash (a rank killed, out of memory, a train step that raised or stopped answering:
`run/loop/restarts.py`) restarts the run: `supervised` closes the crashed run and starts a new one that
resumes from the latest complete checkpoint, up to `training.max_restarts` times; each restart is a
row of metrics.jsonl with its cause, and the summary's `restarts`. `train` (stage 8, verify's
resume probe) and verify's own run are supervised.

A harness that needs the recording gateway (`needs_gateway`: the `agent` harness, whose agents talk
to the model through the OpenAI API) gets the run's (`runtime/rollout/agent_gateway.py`), started before
the sandboxes so a sandboxed agent's allowlist holds its port, and admitting as many sessions as
the rollout's limits allow (`RolloutController.agent_allowance`).

Inference servers that die or hang (docs/security.md row 22): generations resume on their own
(`engines/resume.py`); a server that comes back with its launch weights gets the run's current
weights again before generating resumes, and at every step (`weightsync/publisher.py`). A watchdog
flags any component (server, harness, reward, train step, weight sync) stuck past
`training.watchdog_seconds`; its counts go into metrics.jsonl.

The run's supervisor (`agentrl_cli/run/supervise/`, every `observe.health_interval_s`; 0 = none) polls
the health of the inference servers, the gateway, the reward and sandbox services, and any
`components` the caller hands the run: a dead one leaves the rollout's rotation at once, one the run
started is restarted (`supervisor.max_restarts`, `supervisor.backoff_s`) and brought to the run's
current weights, verified, before it serves again; one that keeps dying stops the run at its next
step boundary with `ComponentFailed` (its name, last log lines, the fix). Servers join and leave a
running run through `<run_dir>/control/servers.json` (`agentrl run servers add|remove URL`).
Counters `supervisor/…` go into the step rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import AsyncIterator, Awaitable, Callable, TypeVar

from agentrl_cli.run.loop.checkpoints import resume, reuse_stored
from agentrl_cli.run.loop.evaluation import evaluate
from agentrl_cli.run.loop.samples import SampleBuilder
from agentrl_cli.run.loop.restarts import crash_cause, describe, exhausted, restart_row
from agentrl_cli.run.loop.steps import RunSummary, StepLoop, samples_per_step
from agentrl_cli.runtime.observe.step_metrics import MetricsLog
from agentrl_cli.runtime.observe.watchdog import Watchdog
from agentrl_cli.core.outcomes import Phase
from agentrl_cli.learner.checkpoint import CheckpointManager

__all__ = ["RunSummary", "TrainingRun", "samples_per_step", "supervised", "train", "training"]
log = logging.getLogger(__name__)
T = TypeVar("T")


class TrainingRun:
    """The parts of one run. `await start()`, `await run(steps)` (any number of times), `await close()`."""

    def __init__(self, cfg, run_dir: Path, model_path: Path, *, run_id: str, phase: str = Phase.TRAIN,
                 progress: Callable[[str], None] = lambda msg: None, trainer: bool = True,
                 components: list | None = None) -> None:
        """`trainer=False`: the rollout side only (servers, harnesses and their sandboxes, reward,
        store, controller), for playing episodes exactly as training does without training on them.
        `components`: more parts for the supervisor to watch (`agentrl_cli.run.supervise.Component`s, e.g.
        a `ProcessComponent` the caller made: started by the supervisor when not running yet, restarted
        like the run's own, stopped by the caller)."""
        self.cfg, self.run_dir, self.model_path, self.run_id, self.phase = cfg, Path(run_dir), Path(model_path), run_id, phase
        self.with_trainer = trainer
        self.progress = progress
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self.metrics = MetricsLog(self.metrics_path, cfg.observe, run_id=run_id)
        self.samples = SampleBuilder(cfg)
        self.watchdog = Watchdog(cfg.training.watchdog_seconds)
        self.servers: list = []
        self.controller = self.backend = self.client = self.writer = self.publisher = self.sandboxes = None
        self.gateway = None  # rollout.agent_gateway.AgentGateway, when a harness needs one
        self.sandbox_leaks: dict = {}  # filled by close(): what outlived the run's sandbox pools
        self.step, self.version, self.resumed_from, self.trained_tokens = 0, 0, None, 0
        self.ledger: list[dict] = []  # per trained step, the draws it trained on (run/loop/ledger.py)
        self.restarts = 0  # trainer restarts before this run (supervised)
        self.restarting = False  # started again after a crash: reuse the stored trajectories even with no checkpoint
        self.step_rows: list[dict] = []  # the step rows and evaluations of this run, whatever ends it
        self.evals: list[dict] = []
        self.checkpoints_written: list[str] = []
        self.components = list(components or [])
        self.supervision = None  # supervise.wiring.RunSupervision, when observe.health_interval_s > 0
        self.supervisor = None  # its Supervisor: the step loop raises its `failed`

    async def start(self) -> None:
        from transformers import AutoTokenizer

        from agentrl_cli.runtime.data.writer import open_writer
        from agentrl_cli.engines.inference.client import client_from_config
        from agentrl_cli.engines.inference.launcher import launch
        from agentrl_cli.runtime.reward.client import reward_client
        from agentrl_cli.runtime.rollout.buffer import TrajectoryBuffer
        from agentrl_cli.runtime.rollout.controller import RolloutController
        from agentrl_cli.runtime.rollout.sampler import TaskSampler
        from agentrl_cli.envs.sandbox.provider import HarnessSandboxes
        from agentrl_cli.learner.backends import make_backend
        from agentrl_cli.weightsync.publisher import WeightPublisher
        from agentrl_cli.weightsync.registry import make_transport
        from harnesses.task_sources import task_set

        cfg, r = self.cfg, self.cfg.rollout
        if cfg.sandbox.service_url and any(_sandboxed_agent(h) for h in cfg.harnesses):
            from agentrl_cli.core.errors import ConfigError

            raise ConfigError("an agent harness runs its command in a sandbox that must reach the run's gateway on this "
                              "host's loopback, which the remote sandbox service (sandbox.service_url) cannot",
                              "unset sandbox.service_url for this run, or run the agent as an entry function")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.progress("starting inference servers")
        # in this (the main) thread: servers get SIGTERM when the thread that started them dies
        self.servers, urls = launch(cfg, str(self.model_path), self.run_dir / "logs", beside_trainer=True)
        self.client = client_from_config(cfg, urls)
        self.client.watchdog = self.watchdog.start()
        if self.with_trainer:
            self.progress(f"starting the trainer ({cfg.training.backend})")
            self.backend = await asyncio.to_thread(make_backend, self.model_path, cfg, self.run_dir)
        self.ckpt = CheckpointManager(self.run_dir / "checkpoints", cfg.training.keep_last_checkpoints)
        train = [h for h in cfg.harnesses if not h.held_out]
        self.sampler = TaskSampler({h.name: task_set(h, cfg.data).select("train") for h in train}, {h.name: h.weight for h in train},
                                   group_size=r.group_size, seed=r.seed, curriculum=r.curriculum)
        self.buffer = TrajectoryBuffer(r.buffer_size, r.max_staleness, r.group_size)
        self.writer = open_writer(cfg.data)
        sandbox_cfg = cfg
        if any(_harness_attr(h.name, "needs_gateway") for h in cfg.harnesses):
            self.progress("starting the recording gateway for agent harnesses")
            self.gateway = await asyncio.to_thread(self._start_gateway, urls)
            sandbox_cfg = self.gateway.sandbox_config(cfg, _sandboxed_agent)
        self.sandboxes = HarnessSandboxes(sandbox_cfg)  # warm pools with each harness's limits, or the sandbox service
        self.controller = RolloutController(cfg, self.client, AutoTokenizer.from_pretrained(self.model_path),
                                            reward_client(cfg), self.sampler, self.buffer, run_id=self.run_id,
                                            writer=self.writer, phase=self.phase, temperature=cfg.inference.temperature,
                                            make_harness=self._make_harness)
        self.controller.gateway = self.gateway
        if not self.with_trainer:
            self.controller.watchdog = self.watchdog
            await self._supervise()
            return
        self.publisher = WeightPublisher(make_transport(cfg, self.client, self.run_dir), self.client,
                                         launch_path=self.model_path, counters=self.controller.counters,
                                         watchdog=self.watchdog, resume_deadline_s=r.resume_deadline_s)
        self.controller.watchdog, self.controller.on_recovered = self.watchdog, self.publisher.resync_servers
        self.loop = StepLoop(self)
        latest = self.ckpt.latest() if cfg.training.resume_from_latest else None
        if latest is not None:
            self.progress(f"resuming from {latest.name}")
            await resume(self, latest)
        elif self.restarting:
            await reuse_stored(self)
        await self._supervise()

    async def _supervise(self) -> None:
        """Start the supervisor over the run's components (none when observe.health_interval_s is 0)."""
        if self.cfg.observe.health_interval_s <= 0:
            return
        from agentrl_cli.run.supervise.wiring import RunSupervision

        self.supervision = RunSupervision(self, self.components)
        self.supervisor = await self.supervision.start()

    def _start_gateway(self, urls: list[str]):
        from agentrl_cli.runtime.rollout.agent_gateway import AgentGateway

        def limit() -> int | None:  # read from the gateway's thread: None until the rollout exists
            return None if self.controller is None else self.controller.agent_allowance()
        return AgentGateway.start(self.cfg, urls, self.model_path, limit=limit, watchdog=self.watchdog)

    def _make_harness(self, name: str):
        """A harness for the rollout: one acting through sandboxes gets its harness's warm pool; one
        that needs the gateway gets it (and, running its agent as a command, its sandbox pool)."""
        from harnesses.registry import create, uses_sandboxes

        extra = {}
        if _harness_attr(name, "needs_gateway"):
            extra["gateway"] = self.gateway
            hc = next((h for h in self.cfg.harnesses if h.name == name), None)
            if hc is not None and _sandboxed_agent(hc):
                extra["sandbox_provider"] = self.sandboxes.for_harness(name)
        return create(name, self.cfg, sandboxes=self.sandboxes.for_harness(name) if uses_sandboxes(name) else None, **extra)

    async def run(self, steps: int, *, deadline_s: float | None = None, eval_tasks: dict | None = None,
                  eval_every: int | None = None, on_step: Callable[[dict], None] = lambda row: None) -> RunSummary:
        """Train until step `steps` (or `deadline_s` seconds); evaluate `eval_tasks` (harness -> tasks)
        before, every `eval_every` steps and at the end."""
        return await self.loop.run_steps(steps, deadline_s=deadline_s, eval_tasks=eval_tasks, eval_every=eval_every,
                                         on_step=on_step)

    async def evaluate(self, eval_tasks: dict) -> dict:
        return await evaluate(self, eval_tasks)

    async def close(self) -> None:
        if self.supervision is not None:  # first: what is stopped below must not be restarted
            await self.supervision.stop()
        self.metrics.close()
        self.watchdog.stop()
        if self.controller is not None:
            self.controller.close()
        if self.gateway is not None:
            await asyncio.to_thread(self.gateway.close_server)
        if self.sandboxes is not None:
            self.sandbox_leaks = self.sandboxes.close()
            if any(self.sandbox_leaks.values()):
                log.error("sandboxes outlived the run: %s", self.sandbox_leaks)
        if self.writer is not None:
            try:
                self.writer.close()
            except Exception:  # noqa: BLE001 - the run's own error matters more
                log.exception("flushing trajectories failed")
        if self.publisher is not None:
            try:
                await self.publisher.close()  # a distributed transport leaves its group on the servers and here
            except Exception:  # noqa: BLE001 - the run's own error matters more
                log.exception("closing the weight transport failed")
        if self.client is not None:
            await self.client.close()
        if self.backend is not None:
            self.backend.close()
        for s in self.servers:
            s.stop()

    async def __aenter__(self) -> "TrainingRun":
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


def _harness_attr(name: str, attr: str) -> bool:
    """A class attribute of a configured harness (`needs_gateway`), False when it is not set."""
    from harnesses.registry import resolve

    return bool(getattr(resolve(name), attr, False))


def _sandboxed_agent(harness_config) -> bool:
    """Whether a harness that needs the gateway runs its agent as a command in a sandbox."""
    return _harness_attr(harness_config.name, "needs_gateway") and bool((harness_config.options or {}).get("command"))


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
                     crashed: list[TrainingRun] | None = None, components: list | None = None) -> T:
    """`await body(run)` on a started run, closed on the way out; after a trainer crash, again on a new
    run resumed from the latest complete checkpoint, up to `training.max_restarts` times (then
    `TrainerRestartsExhausted`, naming the cause). `body` must continue to its goal from the run's
    step (as `TrainingRun.run` does). The crashed runs are appended to `crashed`; `components`: as
    TrainingRun's, for every attempt. A component the supervisor gave up on (`ComponentFailed`) is no
    trainer crash: it ends the run."""
    from agentrl_cli.config.load import with_overrides

    crashed = [] if crashed is None else crashed
    restarts: list[dict] = []
    attempt, pending_row = cfg, None
    while True:
        run = TrainingRun(attempt, run_dir, model_path, run_id=run_id, phase=phase, progress=progress, components=components)
        run.restarts, run.restarting = len(restarts), bool(restarts)
        if pending_row is not None:
            run.metrics.append(pending_row)
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
            if len(restarts) >= cfg.training.max_restarts:
                raise exhausted(restarts, cause, exc, cfg.training.max_restarts) from exc
            latest = run.ckpt.latest() if getattr(run, "ckpt", None) is not None else None
            # a run told not to resume (training.resume_from_latest: false) resumes only what it wrote itself
            written = {n for r in crashed for n in r.checkpoints_written}
            if latest is not None and not (cfg.training.resume_from_latest or latest.name in written):
                latest = None
            pending_row = restart_row(len(restarts) + 1, cause, exc, run.step, latest.name if latest else None)
            restarts.append(pending_row)
            attempt = with_overrides(cfg, {"training.resume_from_latest": latest is not None}, "a trainer restart")
            log.error("the trainer crashed (%s) at step %d: %s; restart %d of %d from %s", cause, run.step, describe(exc),
                      len(restarts), cfg.training.max_restarts, latest.name if latest else "the start")
            progress(f"the trainer crashed ({cause}): restarting from {latest.name if latest else 'the start'} "
                     f"(restart {len(restarts)} of training.max_restarts={cfg.training.max_restarts})")


async def train(cfg, run_dir: Path, model_path: Path, steps: int, *, run_id: str, phase: str = Phase.TRAIN,
                progress: Callable[[str], None] = lambda msg: None, components: list | None = None,
                **run_options) -> RunSummary:
    """Start a run, train to step `steps` (`run_options` as `TrainingRun.run`), close it, restarting
    after a trainer crash (`supervised`). The summary covers the whole run: the steps and evaluations
    of crashed attempts up to the checkpoint the next resumed from, and the restarts; its counters
    include what outlived the last attempt's sandbox pools."""
    crashed: list[TrainingRun] = []
    last: list[TrainingRun] = []

    async def body(run: TrainingRun) -> RunSummary:
        last.append(run)
        return await run.run(steps, **run_options)
    summary = await supervised(cfg, run_dir, model_path, body, run_id=run_id, phase=phase, progress=progress, crashed=crashed,
                               components=components)
    summary.counters.update(last[-1].sandbox_leaks)
    if crashed:
        kept_rows, kept_evals = [], []
        for dead, after in zip(crashed, [*crashed[1:], last[-1]]):
            upto = _resumed_step(after)
            kept_rows = [r for r in kept_rows if r["step"] <= upto] + [r for r in dead.step_rows if r["step"] <= upto]
            kept_evals = [e for e in kept_evals if e["step"] <= upto] + [e for e in dead.evals if e["step"] <= upto]
        summary.metrics = kept_rows + summary.metrics
        seen = {e["step"] for e in kept_evals}
        summary.evals = kept_evals + [e for e in summary.evals if e["step"] not in seen]
        summary.start_step, summary.resumed_from = _resumed_step(crashed[0]), crashed[0].resumed_from
    return summary


def _resumed_step(run: TrainingRun) -> int:
    """The step `run` started at (from its checkpoint, else 0)."""
    return int(run.resumed_from.split("-")[1]) if run.resumed_from else 0
