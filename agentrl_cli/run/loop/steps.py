"""The trainer's step loop: take a step's groups off the buffer, train, record the draws it trained
on (`ledger.py`), publish weights every `rollout.weight_sync_interval_steps`, checkpoint, evaluate,
and append the step's row to metrics.jsonl. A train step that raises ends the loop as
`restarts.TrainerCrashed` (the run restarts from its latest checkpoint). The loop works on the run's
parts and state (`run/parts.py`), never on the run object.

Modes: `async` keeps the rollout running while the trainer steps (bounded by
`rollout.max_staleness`); `sync` generates the step's groups, then trains. In async mode with room
for one version of lag (`max_staleness >= 1`), weight publishing and checkpoint writing leave the
trainer's path: they overlap the next step's wait and train step. Each wait for a step's groups
lasts at most `training.step_wait_timeout_s`: then the step trains the complete groups there are,
and with none the run stops.

With `rollout.dynamic_sampling`, the step's groups pass `shaping.fill_batch` first: groups with no
GRPO signal are dropped and replaced by more off the buffer; a step left with none trains nothing.

Each row carries the step's breakdown (`StepTimes`): on the trainer's path waiting for samples,
the train step, weight sync, checkpoint and the rest; beside it, summed over the episodes since the
last step, generation, reward, store writes and environment.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from typing import Callable

from agentrl_cli.run.loop.checkpoints import CheckpointSchedule
from agentrl_cli.run.loop.evaluation import evaluate
from agentrl_cli.run.loop.ledger import ledger_entry
from agentrl_cli.run.loop.restarts import TrainerCrashed
from agentrl_cli.run.loop.shaping import Shaping, fill_batch
from agentrl_cli.runtime.observe import keys, traces
from agentrl_cli.runtime.observe.step_metrics import step_row
from agentrl_cli.run.supervise.supervisor import unless_failed

ROLLOUT_TIMERS = ("generate_s", "reward_s", "store_s", "env_s")


@dataclass
class RunSummary:
    steps: int
    start_step: int
    version: int
    metrics: list[dict] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)
    checkpoints: list[str] = field(default_factory=list)
    syncs: list[dict] = field(default_factory=list)
    counters: dict = field(default_factory=dict)
    timers: dict = field(default_factory=dict)
    resumed_from: str | None = None
    restarts: list[dict] = field(default_factory=list)  # the trainer restarts of the run (run/loop/restarts.py rows)

    def add_sync(self, entry: dict | None) -> None:
        if entry is not None:
            self.syncs.append(entry)

    def add_checkpoint(self, name: str | None) -> None:
        if name is not None:
            self.checkpoints.append(name)


@dataclass
class StepTimes:
    """Seconds of one step on the trainer's path."""

    wait_s: float = 0.0  # for the step's samples (and the re-sync of restarted servers)
    train_s: float = 0.0
    sync_s: float = 0.0  # the blocking sync, or starting the overlapped publish
    checkpoint_s: float = 0.0  # writing one, or waiting for the one written in the background
    step_s: float = 0.0

    def row(self) -> dict:
        on_path = {"wait_s": self.wait_s, "train_s": self.train_s, "sync_s": self.sync_s, "checkpoint_s": self.checkpoint_s}
        row = {keys.time_part(k): round(v, 4) for k, v in on_path.items()}
        row[keys.time_part("step_s")] = round(self.step_s, 4)
        row[keys.time_part("other_s")] = round(max(0.0, self.step_s - sum(on_path.values())), 4)
        return row


def samples_per_step(cfg) -> int:
    """Samples one trainer step trains on (micro batch x gradient accumulation x ranks) of the platform config `cfg`."""
    return step_samples(cfg.training)


def step_samples(training) -> int:
    return training.micro_batch_size * training.gradient_accumulation_steps * training.world_size


class StepLoop:
    """The steps of one run over its parts and state (`run/parts.py`) and the config sections it
    reads; `supervisor`: the run's (None: none), whose `failed` ends the run at its next wait."""

    def __init__(self, parts, state, rollout, training, observe, *, supervisor=None) -> None:
        self.parts, self.state, self.supervisor = parts, state, supervisor
        self.rollout, self.training, self.observe = rollout, training, observe
        self.groups_per_step = max(1, math.ceil(step_samples(training) / rollout.group_size))
        self.overlap = rollout.mode == "async" and rollout.max_staleness >= 1
        self.checkpoints = CheckpointSchedule(parts, state, training, overlap=self.overlap)
        self._taken = 0  # steps whose samples the trainer has taken from the buffer
        self.shaping = Shaping(training) if rollout.dynamic_sampling else None
        self.skipped_steps = 0  # dynamic sampling: steps left with no group with signal
        self._last_timers: dict = {}
        self._last_episodes = 0

    async def run_steps(self, steps: int, *, deadline_s: float | None = None, eval_tasks: dict | None = None,
                        eval_every: int | None = None, on_step: Callable[[dict], None] = lambda row: None) -> RunSummary:
        parts, state = self.parts, self.state
        summary = RunSummary(steps=0, start_step=state.step, version=state.version, resumed_from=state.resumed_from)
        self._taken = state.step
        stop = asyncio.Event()
        t_start = time.perf_counter()
        rollout = None
        if self.rollout.mode == "async":
            parts.controller.lead_limit = lambda: self.rollout_lead(steps)
            rollout = asyncio.create_task(parts.controller.run(stop))
        if eval_tasks:
            summary.evals.append(await self._evaluate(eval_tasks))
            state.evals.append(summary.evals[-1])
        try:
            while state.step < steps and (deadline_s is None or time.perf_counter() - t_start < deadline_s):
                row = await traces.train_step(self.observe, parts.run_id, state.step + 1,
                                              self._step(steps, rollout is None, summary, t_start))
                parts.metrics.append(row)
                state.step_rows.append(row)
                summary.metrics.append(row)
                on_step(row)
                if eval_tasks and eval_every and state.step % eval_every == 0:
                    summary.evals.append(await self._evaluate(eval_tasks))
                    state.evals.append(summary.evals[-1])
        finally:
            stop.set()
            try:
                summary.add_checkpoint(await self.checkpoints.wait())
                summary.add_sync(await parts.publisher.wait())
            finally:
                if rollout is not None:
                    await rollout
                parts.controller.lead_limit = None
        if eval_tasks and (not summary.evals or summary.evals[-1]["step"] != state.step):  # none twice at one step
            summary.evals.append(await self._evaluate(eval_tasks))
        summary.steps, summary.version = state.step, state.version
        summary.counters = (dict(parts.controller.counters) | {f"buffer/{k}": v for k, v in parts.buffer.counters.items()}
                            | parts.watchdog.report() | parts.sandboxes.metrics())
        summary.timers = {k: round(v, 3) for k, v in parts.controller.timers.items()}
        return summary

    async def _evaluate(self, eval_tasks: dict) -> dict:
        return await evaluate(self.parts, self.state, eval_tasks, concurrency=self.rollout.eval_concurrency)

    async def _step(self, steps: int, generate_first: bool, summary: RunSummary, t_start: float) -> dict:
        parts, state = self.parts, self.state
        controller, publisher = parts.controller, parts.publisher
        times = StepTimes()
        t0 = time.perf_counter()
        controller.harness_errors.raise_if_failed()
        summary.add_sync(await publisher.before_step(parts.backend, state.version))
        groups = await self._take(self.groups_per_step, generate_first, counts=self.shaping is None)
        if not groups:
            raise RuntimeError(f"the rollout produced no complete group in time (within training.step_wait_timeout_s="
                               f"{self.training.step_wait_timeout_s:g} s); see the episode errors in the log")
        shaped = None
        if self.shaping is not None:
            groups, shaped = await fill_batch(groups, self.groups_per_step, lambda n: self._take(n, generate_first),
                                              self.shaping, self.rollout.max_refill_rounds)
            self.skipped_steps += shaped.skipped
            self._taken += 1  # after the refills, which the rollout's lead must still make room for
        t_ckpt = time.perf_counter()
        times.wait_s = t_ckpt - t0
        summary.add_checkpoint(await self.checkpoints.wait())  # written while this step's samples came in
        t1 = time.perf_counter()
        samples, stats = parts.samples(groups, state.version)
        try:
            with parts.watchdog.busy("trainer"):
                metrics = await asyncio.to_thread(parts.backend.train_step, samples) if samples else {}
        except Exception as exc:
            raise TrainerCrashed(f"the train step of step {state.step + 1} failed",
                                 "the run restarts from its latest checkpoint (training.max_restarts)") from exc
        t2 = time.perf_counter()
        times.train_s = t2 - t1
        state.step += 1
        state.ledger.append(ledger_entry(state.step, groups))
        if state.step % self.rollout.weight_sync_interval_steps == 0:
            state.version += 1
            if self.overlap:
                summary.add_sync(await publisher.wait())
                await publisher.start(parts.backend, state.version)
                times.sync_s = time.perf_counter() - t2
            else:
                entry = await publisher.sync_retrying(parts.backend, state.version)
                summary.syncs.append(entry)
                times.sync_s = entry["seconds"]
        t3 = time.perf_counter()
        if self.checkpoints.due(state.step, steps):
            summary.add_checkpoint(await self.checkpoints.save(state.step, steps))
        times.checkpoint_s = time.perf_counter() - t3 + t1 - t_ckpt
        times.step_s = time.perf_counter() - t0
        state.trained_tokens += stats.get(keys.TOKENS_TRAINED) or 0
        row = step_row(step=state.step, version=state.version, metrics=metrics, stats=stats, wait_s=times.wait_s,
                       train_s=times.train_s, sync_s=times.sync_s, elapsed=time.perf_counter() - t_start, controller=controller,
                       buffer=parts.buffer, watchdog=parts.watchdog, trained_tokens=state.trained_tokens)
        row.update(times.row())
        row[keys.TRAINER_RESTARTS] = state.restarts
        if shaped is not None:
            row.update(shaped.row(self.skipped_steps))
        row.update(self._rollout_work())
        row.update(controller.harness_stats.snapshot())
        row.update(parts.sandboxes.metrics())
        row.update({keys.rollout(k): v for k, v in controller.counters.items()
                    if k.startswith(("truncated_", "env_create_", "token_exact_"))})
        row.update({k: v for k, v in controller.counters.items()
                    if k.startswith(("env/", keys.gateway(""), keys.supervisor("")))})  # harness errors; gateway, supervisor
        return row

    async def _take(self, n: int, generate_first: bool, counts: bool = False) -> list:
        """Up to `n` groups off the buffer, waiting at most training.step_wait_timeout_s; in sync mode
        (`generate_first`) generated first. `counts`: the step counts as taken (`rollout_lead`) in the
        same turn its groups leave the buffer, so the rollout never sees them gone and the step still
        to take (it would start more)."""
        parts = self.parts
        if generate_first:  # sync mode: generate this step's groups, then train
            await parts.controller.run(asyncio.Event(), max_groups=n)

        async def take() -> list:
            groups = await parts.buffer.take(n, self.state.version, timeout=self.training.step_wait_timeout_s)
            self._taken += counts
            return groups
        # a component the run's supervisor gave up on ends the run here, at once or while waiting
        groups = await unless_failed(self.supervisor, take())
        parts.controller.harness_errors.raise_if_failed()
        return groups

    def _rollout_work(self) -> dict:
        """The rollout's work since the last step, summed over episodes, and the episodes finished."""
        timers, counters = self.parts.controller.timers, self.parts.controller.counters
        episodes = sum(v for k, v in counters.items() if k.startswith("termination_"))
        row = {keys.time_part(k): round(timers.get(k, 0.0) - self._last_timers.get(k, 0.0), 4) for k in ROLLOUT_TIMERS}
        row[keys.ROLLOUT_EPISODES_STEP] = episodes - self._last_episodes
        self._last_timers, self._last_episodes = dict(timers), episodes
        return row

    def rollout_lead(self, steps: int) -> int:
        """Most episodes the async rollout keeps in flight and buffered: what the remaining steps
        will train, and no more than the trainer can take before they pass `rollout.max_staleness`
        (one step's worth, plus `max_staleness` versions of `weight_sync_interval_steps` steps)."""
        r = self.rollout
        per_step = self.groups_per_step * r.group_size
        remaining = max(0, steps - self._taken) * per_step
        return min(remaining, per_step * (1 + r.weight_sync_interval_steps * r.max_staleness))
