"""One training run: inference servers, rollout controller, DeepSpeed GRPO trainer, verified weight
sync and checkpoints, joined by the bounded buffer. This module is the runbook of a
run; the parts live in `rollout/`, `training/` and `inference/`.

Modes: `async` keeps the rollout running while the trainer steps (bounded by `rollout.max_staleness`);
`sync` generates the step's groups, then trains. Every step appends a row to the run's
`metrics.jsonl`: losses and diagnostics, reward, phase times (sampling wait, training, sync),
counters (tokens, buffer fill, staleness drops, goodput); every evaluation appends a row of
`eval/<harness>/success_rate`. Resume picks the newest complete
checkpoint and restores the model, optimizer, step, weight version, sampler position and RNGs.

Inference servers that die or hang (docs/security.md row 22): generations resume on their own
(`rollout/resume.py`); a server that comes back with its launch weights gets the run's current
weights again before generating resumes, and at every step (`weight_resyncs`). A watchdog flags
any component — server, harness, reward, train step, weight sync — stuck past
`training.watchdog_seconds`; its counts go into metrics.jsonl.
"""

from __future__ import annotations

import asyncio
import logging
import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable


from agentrl_cli.outcomes import Outcome
from agentrl_cli.inference.client import TRANSPORT_ERRORS, InferenceError
from agentrl_cli.rollout.resume import resync_stale_servers, stale_servers
from agentrl_cli.training.checkpoint import CheckpointManager, rng_state, set_rng_state
from agentrl_cli.training.grpo import Sample, group_advantages
from agentrl_cli.observe.step_metrics import MetricsLog, step_row
from agentrl_cli.reward.aggregate import RewardNormalizer
from agentrl_cli.sandbox.provider import HarnessSandboxes
from agentrl_cli.observe.watchdog import Watchdog
from agentrl_cli.training.weight_sync import WeightSyncError

log = logging.getLogger(__name__)


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


def samples_per_step(cfg) -> int:
    t = cfg.training
    return t.micro_batch_size * t.gradient_accumulation_steps * t.world_size


class TrainingRun:
    """`await run(steps=…)`; call `close()` (or use `async with`)."""

    def __init__(self, cfg, run_dir: Path, model_path: Path, *, run_id: str, phase: str = "train",
                 progress: Callable[[str], None] = lambda msg: None) -> None:
        self.cfg, self.run_dir, self.model_path, self.run_id, self.phase = cfg, Path(run_dir), Path(model_path), run_id, phase
        self.progress = progress
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self.metrics = MetricsLog(self.metrics_path, cfg.observe, run_id=run_id)
        self.normalizer = RewardNormalizer(cfg.reward.normalization, cfg.reward.window_size)
        self._trained_tokens = 0  # tokens of trained episodes so far (goodput's numerator)
        self.servers: list = []
        self.controller = self.backend = self.client = self.writer = self.sync = self.sandboxes = None
        self.sandbox_leaks: dict = {}  # filled by close(): what outlived the run's sandbox pools
        self.watchdog = Watchdog(cfg.training.watchdog_seconds)
        self._weights_lock = asyncio.Lock()  # a re-sync never interleaves with the trainer's sync
        self._full_sync_due = False  # a server needs weights the transport cannot re-send alone
        self._publish_task: asyncio.Task | None = None  # servers loading the last version (async mode)
        self._ckpt_task: asyncio.Task | None = None  # a checkpoint being written (async mode)
        self._taken = 0  # steps whose samples the trainer has taken from the buffer

    # ---- setup -----------------------------------------------------------------------------------

    async def start(self) -> None:
        from transformers import AutoTokenizer

        from agentrl_cli.data.writer import open_writer
        from agentrl_cli.inference.client import client_from_config
        from agentrl_cli.inference.launcher import launch
        from agentrl_cli.reward.client import reward_client
        from agentrl_cli.rollout.buffer import TrajectoryBuffer
        from agentrl_cli.rollout.controller import RolloutController
        from agentrl_cli.rollout.sampler import TaskSampler
        from agentrl_cli.training.backends import make_backend
        from agentrl_cli.training.weight_sync import make_weight_sync
        from harnesses.task_sources import task_set

        cfg = self.cfg
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.progress("starting inference servers")
        # in this (the main) thread: servers get SIGTERM when the thread that started them dies
        self.servers, urls = launch(cfg, str(self.model_path), self.run_dir / "logs", beside_trainer=True)
        self.client = client_from_config(cfg, urls)
        self.client.watchdog = self.watchdog.start()
        self.progress("starting the trainer (DeepSpeed)")
        self.backend = await asyncio.to_thread(make_backend, self.model_path, cfg, self.run_dir)
        self.ckpt = CheckpointManager(self.run_dir / "checkpoints", cfg.training.keep_last_checkpoints)
        self.sync = make_weight_sync(cfg.training.weight_sync, self.client, self.run_dir / "weights")
        train = [h for h in cfg.harnesses if not h.held_out]
        self.sampler = TaskSampler({h.name: task_set(h, cfg.data).select("train") for h in train}, {h.name: h.weight for h in train},
                                   group_size=cfg.rollout.group_size, seed=cfg.rollout.seed, curriculum=cfg.rollout.curriculum)
        self.buffer = TrajectoryBuffer(cfg.rollout.buffer_size, cfg.rollout.max_staleness, cfg.rollout.group_size)
        self.writer = open_writer(cfg.data)
        self.reward = reward_client(cfg)
        tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.sandboxes = HarnessSandboxes(cfg)  # warm pools with each harness's limits, or the sandbox service
        self.controller = RolloutController(cfg, self.client, tokenizer, self.reward, self.sampler, self.buffer,
                                            run_id=self.run_id, writer=self.writer, phase=self.phase,
                                            temperature=cfg.inference.temperature,
                                            make_harness=self._make_harness)
        self.controller.watchdog, self.controller.on_recovered = self.watchdog, self.resync_servers
        self.step, self.version, self.resumed_from = 0, 0, None
        latest = self.ckpt.latest() if cfg.training.resume_from_latest else None
        if latest is not None:
            self.progress(f"resuming from {latest.name}")
            state = await asyncio.to_thread(self.backend.load_checkpoint, latest / "engine")
            self.step, self.version = int(state["step"]), int(state["version"])
            self.sampler.load_state_dict(state["sampler"])
            set_rng_state(state["rng"])
            await self._reload_buffer(state.get("buffer", {}).get("pending", []))
            # episodes in flight at the checkpoint run again first, and every draw repeated after the
            # resume (same group ids, same trajectory ids) reuses a stored trajectory instead of storing it twice
            self.controller.restore(state.get("inflight", []))
            self.controller.stored_ids = await asyncio.to_thread(self._stored_ids)
            self.controller.fetch = self._fetch
            self.resumed_from = latest.name
            await self._sync_weights()

    def _make_harness(self, name: str):
        """A harness for the rollout: one acting through sandboxes gets its harness's warm pool."""
        from harnesses.registry import create, uses_sandboxes

        return create(name, self.cfg, sandboxes=self.sandboxes.for_harness(name) if uses_sandboxes(name) else None)

    async def __aenter__(self) -> "TrainingRun":
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        self.metrics.close()
        self.watchdog.stop()
        if self.controller is not None:
            self.controller.close()
        if self.sandboxes is not None:
            self.sandbox_leaks = self.sandboxes.close()
            if any(self.sandbox_leaks.values()):
                log.error("sandboxes outlived the run: %s", self.sandbox_leaks)
        if self.writer is not None:
            try:
                self.writer.close()
            except Exception:  # noqa: BLE001 - the run's own error matters more
                log.exception("flushing trajectories failed")
        if self.sync is not None:
            try:
                await self.sync.close()  # a distributed sync leaves its group on the servers and here
            except Exception:  # noqa: BLE001 - the run's own error matters more
                log.exception("closing the weight-update group failed")
        if self.client is not None:
            await self.client.close()
        if self.backend is not None:
            self.backend.close()
        for s in self.servers:
            s.stop()

    # ---- the loop --------------------------------------------------------------------------------

    def _stored_ids(self) -> set[str]:
        import pyarrow.compute as pc

        table = self.writer.store.read_table((pc.field("run_id") == self.run_id) & (pc.field("phase") == self.phase))
        return set(table.column("trajectory_id").to_pylist())

    def _fetch(self, tid: str):
        from agentrl_cli.data.writer import find_trajectory

        return find_trajectory(self.writer.store, tid)

    async def _reload_buffer(self, ids: list[str]) -> set[str]:
        """Put the checkpoint's untrained episodes back into the buffer, from the store; returns the
        ids found."""
        import pyarrow.compute as pc

        from agentrl_cli.data.writer import read_records
        from agentrl_cli.rollout.buffer import Episode
        from agentrl_cli.rollout.controller import version_number

        if not ids:
            return set()
        records = await asyncio.to_thread(read_records, self.writer.store, pc.field("trajectory_id").isin(ids))
        for r in sorted(records, key=lambda r: ids.index(r.trajectory_id)):
            await self.buffer.put(Episode(r.group_id, r, version_number(r.policy_version_first),
                                          self.controller.reward_of_record(r)))  # generated before the resume
        return {r.trajectory_id for r in records}

    def _samples(self, groups) -> tuple[list[Sample], dict]:
        eps = [e for g in groups for e in g]
        normalized = self.normalizer.apply([e.reward for e in eps], [e.group_id for e in eps])
        adv = group_advantages(normalized, [e.group_id for e in eps], scale=self.cfg.training.advantage_std_scale)
        samples = [Sample(token_ids=e.record.token_ids, loss_mask=e.record.loss_mask, logprobs=e.record.logprobs, advantage=a)
                   for e, a in zip(eps, adv) if e.reward is not None]
        rewards = [e.reward for e in eps if e.reward is not None]
        stats = {"reward/mean": statistics.fmean(rewards) if rewards else None,
                 "reward/std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
                 "reward/success_rate": sum(e.record.outcome == Outcome.SUCCESS for e in eps) / len(eps) if eps else None,
                 "reward/masked": sum(e.reward is None for e in eps),
                 "rollout/staleness_mean": statistics.fmean(self.version - e.version for e in eps) if eps else None,
                 "tokens/trained": sum(e.tokens for e in eps)}
        return samples, stats

    async def run(self, steps: int, *, deadline_s: float | None = None, eval_tasks: dict | None = None,
                  eval_every: int | None = None, on_step: Callable[[dict], None] = lambda row: None) -> RunSummary:
        cfg = self.cfg
        summary = RunSummary(steps=0, start_step=self.step, version=self.version, resumed_from=self.resumed_from)
        groups_per_step = max(1, math.ceil(samples_per_step(cfg) / cfg.rollout.group_size))
        # async with room for one version of lag: weight publishing and checkpoint writing leave the
        # trainer's path (they overlap the next step's wait and train step)
        overlap = cfg.rollout.mode == "async" and cfg.rollout.max_staleness >= 1
        stop = asyncio.Event()
        t_start = time.perf_counter()
        self._taken = self.step
        rollout = None
        if cfg.rollout.mode == "async":
            self.controller.lead_limit = lambda: self._rollout_lead(steps, groups_per_step)
            rollout = asyncio.create_task(self.controller.run(stop))
        if eval_tasks:
            summary.evals.append(await self._evaluate(eval_tasks))
        try:
            while self.step < steps and (deadline_s is None or time.perf_counter() - t_start < deadline_s):
                t0 = time.perf_counter()
                if not self._publishing():  # a publish in flight brings every server up to date itself
                    await self.resync_servers()  # a server restarted between requests serves its launch weights
                if self._full_sync_due:
                    self._full_sync_due = False
                    await self._await_publish(summary)
                    await self._sync_weights()
                    self.controller.counters["weight_resyncs"] += 1
                if rollout is None:  # sync mode: generate this step's groups, then train
                    await self.controller.run(asyncio.Event(), max_groups=groups_per_step)
                groups = await self.buffer.take(groups_per_step, self.version, timeout=cfg.rollout.step_timeout_seconds * 10)
                if not groups:
                    raise RuntimeError("the rollout produced no complete group in time; see the episode errors in the log")
                self._taken += 1
                t_ckpt = time.perf_counter()
                await self._await_checkpoint(summary)  # written while this step's samples came in
                t1 = time.perf_counter()
                samples, stats = self._samples(groups)
                with self.watchdog.busy("trainer"):
                    metrics = await asyncio.to_thread(self.backend.train_step, samples) if samples else {}
                t2 = time.perf_counter()
                self.step += 1
                sync_s = 0.0
                if self.step % cfg.rollout.weight_sync_interval_steps == 0:
                    self.version += 1
                    if overlap:
                        await self._await_publish(summary)
                        await self._start_publish()
                        sync_s = time.perf_counter() - t2
                    else:
                        entry = await self._sync_weights()
                        summary.syncs.append(entry)
                        sync_s = entry["seconds"]
                t3 = time.perf_counter()
                if self.step % cfg.training.checkpoint_interval_steps == 0 or self.step == steps:
                    if overlap and self.step < steps:
                        self._ckpt_task = asyncio.create_task(self._checkpoint())
                    else:
                        summary.checkpoints.append(await self._checkpoint())
                checkpoint_s = time.perf_counter() - t3 + t1 - t_ckpt
                self._trained_tokens += stats.get("tokens/trained") or 0
                row = step_row(step=self.step, version=self.version, metrics=metrics, stats=stats, wait_s=t_ckpt - t0,
                               train_s=t2 - t1, sync_s=sync_s, elapsed=time.perf_counter() - t_start,
                               controller=self.controller, buffer=self.buffer, watchdog=self.watchdog,
                               trained_tokens=self._trained_tokens)
                row.update(self._step_breakdown(time.perf_counter() - t0, wait_s=t_ckpt - t0, train_s=t2 - t1, sync_s=sync_s,
                                                checkpoint_s=checkpoint_s))
                row.update(self.controller.harness_stats.snapshot())
                row.update(self.sandboxes.metrics())
                row.update({f"rollout/{k}": v for k, v in self.controller.counters.items()
                            if k.startswith(("truncated_", "env_create_", "token_exact_"))})
                self._log(row)
                summary.metrics.append(row)
                on_step(row)
                if eval_tasks and eval_every and self.step % eval_every == 0:
                    summary.evals.append(await self._evaluate(eval_tasks))
        finally:
            stop.set()
            try:
                await self._await_checkpoint(summary)
                await self._await_publish(summary)
            finally:
                if rollout is not None:
                    await rollout
                self.controller.lead_limit = None
        if eval_tasks and (not summary.evals or summary.evals[-1]["step"] != self.step):  # none twice at one step
            summary.evals.append(await self._evaluate(eval_tasks))
        summary.steps, summary.version = self.step, self.version
        summary.counters = (dict(self.controller.counters) | {f"buffer/{k}": v for k, v in self.buffer.counters.items()}
                            | self.watchdog.report() | self.sandboxes.metrics())
        summary.timers = {k: round(v, 3) for k, v in self.controller.timers.items()}
        return summary

    def _log(self, row: dict) -> None:
        self.metrics.append(row)

    def _rollout_lead(self, steps: int, groups_per_step: int) -> int:
        """Most episodes the async rollout keeps in flight and buffered: what the remaining steps
        will train, and no more than the trainer can take before they pass `rollout.max_staleness`
        (one step's worth, plus `max_staleness` versions of `weight_sync_interval_steps` steps)."""
        r = self.cfg.rollout
        per_step = groups_per_step * r.group_size
        remaining = max(0, steps - self._taken) * per_step
        return min(remaining, per_step * (1 + r.weight_sync_interval_steps * r.max_staleness))

    def _publishing(self) -> bool:
        return self._publish_task is not None and not self._publish_task.done()

    async def _start_publish(self) -> None:
        """Read this version's weights off the trainer now (export or copies, and the values to verify
        against), and let the servers load and verify them while the trainer goes on."""
        version = self.version
        with self.watchdog.busy("weight_sync"):
            prepared = await self.sync.prepare(self.backend, version)

        async def publish() -> dict:
            async with self._weights_lock:
                with self.watchdog.busy("weight_sync"):
                    return await self.sync.publish(prepared)
        self._publish_task = asyncio.create_task(publish())

    async def _await_publish(self, summary: RunSummary) -> None:
        """Wait for the weight publish in flight; one that failed makes the next step sync in full."""
        task, self._publish_task = self._publish_task, None
        if task is None:
            return
        try:
            summary.syncs.append(await task)
        except (InferenceError, WeightSyncError, *TRANSPORT_ERRORS) as exc:
            log.error("publishing weights to the servers failed (%s); the next step syncs again", exc)
            self.controller.counters["weight_sync_retries"] += 1
            self._full_sync_due = True

    async def _await_checkpoint(self, summary: RunSummary) -> None:
        task, self._ckpt_task = self._ckpt_task, None
        if task is not None:
            summary.checkpoints.append(await task)

    def _step_breakdown(self, step_s: float, **on_path: float) -> dict:
        """Where one step's time went: on the trainer's path (`on_path`: waiting for samples, train
        step, weight sync, checkpoint; `other_s` is the rest) and, beside it, the rollout's work since
        the last step summed over episodes (generation, reward, store writes, environment)."""
        timers = self.controller.timers
        last = getattr(self, "_last_timers", {})
        episodes = sum(v for k, v in self.controller.counters.items() if k.startswith("termination_"))
        row = {f"time/{k}": round(v, 4) for k, v in on_path.items()}
        row["time/step_s"] = round(step_s, 4)
        row["time/other_s"] = round(max(0.0, step_s - sum(on_path.values())), 4)
        for key in ("generate_s", "reward_s", "store_s", "env_s"):
            row[f"time/{key}"] = round(timers.get(key, 0.0) - last.get(key, 0.0), 4)
        row["rollout/episodes_step"] = episodes - getattr(self, "_last_episodes", 0)
        self._last_timers, self._last_episodes = dict(timers), episodes
        return row

    async def _sync_weights(self) -> dict:
        """The trainer's weight sync; a server that is down is waited for (resume deadline) and the
        sync tried once more, so a restart during a sync does not end the run."""
        async with self._weights_lock:
            try:
                with self.watchdog.busy("weight_sync"):
                    return await self.sync.sync(self.backend, self.version)
            except (InferenceError, WeightSyncError, *TRANSPORT_ERRORS) as exc:
                log.error("weight sync to version %s failed (%s); waiting for the servers and retrying", self.version, exc)
                self.controller.counters["weight_sync_retries"] += 1
            await self.client.wait_healthy(self.cfg.rollout.resume_deadline_s)
            with self.watchdog.busy("weight_sync"):
                return await self.sync.sync(self.backend, self.version)

    async def resync_servers(self) -> None:
        """Give a server that serves another weight version than the run's last sync (it restarted
        with its launch weights) the current weights again; counted as `weight_resyncs`."""
        async with self._weights_lock:
            last = self.sync.history[-1] if self.sync.history else {"version": 0, "path": str(self.model_path)}
            try:
                if "path" not in last:  # no files to load (distributed): the next step syncs every server
                    if await stale_servers(self.client.urls, str(last["version"]), headers=self.client.headers):
                        self._full_sync_due = True
                    return
                synced = await resync_stale_servers(self.client.urls, str(last["version"]), last["path"], headers=self.client.headers)
            except InferenceError as exc:
                log.error("re-syncing weights failed: %s", exc.message)
                self.controller.counters["weight_resync_failures"] += 1
                return
        self.controller.counters["weight_resyncs"] += len(synced)

    async def _checkpoint(self) -> str:
        # one event-loop turn (no await): every finished episode is published and either in the buffer
        # snapshot or still in flight; resume reloads the one and re-runs the other. The engine's
        # weights stay as they are until the save returns: the next train step awaits it.
        self.writer.flush()
        state = {"step": self.step, "version": self.version, "sampler": self.sampler.state_dict(), "rng": rng_state(),
                 "buffer": self.buffer.state_dict(), "inflight": self.controller.snapshot()}
        path = await asyncio.to_thread(self.ckpt.save, self.step,
                                       lambda d: self.backend.save_checkpoint(d / "engine", state),
                                       {"version": self.version, "run_id": self.run_id})
        return path.name

    async def _evaluate(self, eval_tasks: dict) -> dict:
        names = list(eval_tasks)  # every harness at once: one server batch across all of them
        n = self.cfg.rollout.eval_concurrency
        limit = asyncio.Semaphore(n) if n > 0 else None
        results = await asyncio.gather(*(self.controller.evaluate(eval_tasks[h], temperature=0.0, limit=limit) for h in names))
        self._log({"step": self.step, "version": self.version,  # the curve, readable while the run goes on
                   **{f"eval/{n}/success_rate": r["success_rate"] for n, r in zip(names, results)},
                   **{f"eval/{n}/episodes": r["n"] for n, r in zip(names, results)}})
        return {"step": self.step, "version": self.version, **dict(zip(names, results))}
