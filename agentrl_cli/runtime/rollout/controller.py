"""The rollout controller: an asyncio loop that keeps up to `rollout.concurrency` episodes in flight
across harness instances, sends every generation to the inference client (so the server batches
across episodes), scores finished trajectories through the reward client, writes them to the
trajectory store and puts them into the bounded buffer.

Backpressure: groups are drawn whole, and their episodes start one by one while fewer than
`concurrency` are in flight and episodes in flight + episodes buffered stay within the buffer's
capacity, and within `lead_limit()` when the run sets one (what its remaining steps can train before
the episodes grow stale), so an async rollout does not generate episodes nobody trains
(`backpressure_waits` counts the times it had to wait; `in_flight_peak` and `held_peak`, in flight
plus buffered, the most there were at once). The buffer's capacity comes from `rollout.buffer_size`
and the memory budget `rollout.max_buffer_mb` (`TrajectoryBuffer.from_config`). A concurrency below the group size
therefore runs a group's episodes in turn (concurrency 1: one episode at a time). Harness instances
are reused, one episode at a time each, at most `concurrency` (or the harness's own `max_concurrency`,
or fewer when its environment's server refuses sessions at capacity: `env_busy.py`).

An episode whose generation could not be completed (inference servers down past the resume
deadline) ends as `infra_error`: it is not scored, and goes to the store and the buffer masked, like
an episode the reward service could not score. Counters: see `resume.COUNTERS`, `weight_resyncs`.

Every episode is the one episode loop (`episode_loop.py`) around an actor: the policy
(`run_episode.play_policy`), an agent that plays itself (`plays_itself`: the `agent` harness,
`agent_episode.play_agent`, through the run's gateway, `gateway`, set by the run) or the seats of a
multi-agent harness. What the controller does around it (lend a harness instance, count, score,
record, store) is `episode_scaffold.py`, the same for all three. The gateway admits as many sessions
as `agent_allowance()` (the same limits the loop starts episodes under), and its counters are
mirrored into `counters` as `gateway/…`.

A multi-agent harness (one with `roles`) is played by `multi_play.play_roles`: one episode, one
record and one buffered episode per role the policy plays, grouped by (draw, role) for GRPO.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import Counter, defaultdict

from agentrl_cli.core.errors import EnvironmentBusy
from agentrl_cli.core.outcomes import Outcome, Phase, RewardStatus, Termination
from agentrl_cli.runtime.data.record_from_episode import record_from_episode
from agentrl_cli.runtime.rollout.buffer import Episode, TrajectoryBuffer
from agentrl_cli.runtime.rollout.env_busy import EnvBusy, busy_too_long
from agentrl_cli.runtime.rollout.harness_errors import HarnessErrors
from agentrl_cli.runtime.rollout.harness_threads import HarnessThreads
from agentrl_cli.runtime.rollout.agent_episode import play_agent
from agentrl_cli.runtime.rollout.episode_scaffold import Lent, account, count, infra_lost, keep, lend, score, settings
from agentrl_cli.runtime.rollout.multi_play import Seating, play_roles, role_trajectory_id
from agentrl_cli.runtime.rollout.run_episode import EpisodeResult, play_policy
from agentrl_cli.engines.resume import ResumePolicy
from agentrl_cli.runtime.rollout.sampler import Draw, TaskSampler
from agentrl_cli.runtime.observe.harness_stats import HarnessStats
from agentrl_cli.runtime.observe.watchdog import Watchdog
from agentrl_cli.runtime.observe import traces
from harnesses.multi_agent import role_group
from harnesses.task_sources import task_set

log = logging.getLogger(__name__)
TRUNCATION_PENALTY = -1.0  # rollout.truncation: penalize — below any finished episode's reward


def version_number(weight_version: str) -> int:
    """The trainer's integer policy version from a server's weight_version ("3", "v3"; else 0)."""
    digits = "".join(c for c in str(weight_version) if c.isdigit())
    return int(digits) if digits else 0


class HarnessPool:
    """Idle instances of one harness, created on demand up to `limit` (lowered by `cap` when the
    harness's environment says it holds fewer sessions)."""

    def __init__(self, make, limit: int) -> None:
        self.make, self.limit = make, limit
        self.idle: list = []
        self.made = 0
        self.busy = 0
        self._freed = asyncio.Event()

    async def acquire(self, loop, executor):
        while self.busy >= self.limit:
            self._freed.clear()
            await self._freed.wait()
        self.busy += 1
        if self.idle:
            return self.idle.pop()
        self.made += 1
        try:
            return await loop.run_in_executor(executor, self.make)
        except BaseException:
            self.busy -= 1
            self._freed.set()
            raise

    def release(self, h) -> None:
        self.idle.append(h)
        self.busy -= 1
        self.cap(self.limit)
        self._freed.set()

    def retire(self, h) -> None:
        """Take `h` out of the pool for good (a call of it still runs in another thread past its
        deadline): closed on a thread of its own, since its close may wait on that call - closing is
        what ends a hung call in a harness that can be ended (its process, its sandbox) - and a new
        instance is made for the next episode."""
        self.busy -= 1
        self._freed.set()
        threading.Thread(target=_close_quietly, args=(h,), name="harness-retire", daemon=True).start()

    def cap(self, limit: int) -> None:
        """At most `limit` instances from now on; idle ones past it are closed (each may hold a session)."""
        self.limit = max(1, min(self.limit, limit))
        while self.idle and len(self.idle) + self.busy > self.limit:
            self.idle.pop(0).close()

    def close(self) -> None:
        for h in self.idle:
            h.close()
        self.idle.clear()


def _close_quietly(h) -> None:
    try:
        h.close()
    except Exception:  # noqa: BLE001 - a retired instance that fails to close is only logged
        log.exception("closing a retired harness instance (%s) failed", getattr(h, "name", type(h).__name__))


class RolloutController:
    def __init__(self, config, client, tokenizer, reward, sampler: TaskSampler, buffer: TrajectoryBuffer, *,
                 run_id: str, writer=None, make_harness=None, phase: str = Phase.TRAIN, temperature: float = 1.0) -> None:
        from harnesses.registry import create

        self.config, self.client, self.tokenizer, self.reward = config, client, tokenizer, reward
        self.sampler, self.buffer, self.writer, self.run_id, self.phase = sampler, buffer, writer, run_id, phase
        self.temperature = temperature
        r = config.rollout
        self.concurrency = r.concurrency
        self.executor = HarnessThreads(max_workers=min(r.concurrency, 64), thread_name_prefix="harness")
        self._make = make_harness or (lambda name: create(name, config))
        self._limits = {h.name: h.max_concurrency or r.concurrency for h in config.harnesses}
        self._reward_sources: dict[str, str] = {}  # harness -> harnesses[].reward as resolved (registry.reward_source)
        self.pools: dict[str, HarnessPool] = {}
        self.in_flight = 0
        self.inflight_draws: dict[str, Draw] = {}  # started, not yet in the buffer (snapshot for resume)
        self.pending: list[Draw] = []  # draws to run before new ones (restored from a snapshot)
        self.starting: list[Draw] = []  # the current group's draws not started yet (backpressure)
        self.stored_ids: set[str] = set()  # after a resume: trajectories of this run already in the store
        self.fetch = None  # tid -> TrajectoryRecord | None, to reuse a stored trajectory instead of re-running it
        self.counters: Counter = Counter()
        self.timers: defaultdict = defaultdict(float)
        self.resume = ResumePolicy.from_config(config)
        self.on_recovered = None  # async (): awaited when a lost server is back, before generating resumes
        self.watchdog = Watchdog(config.training.watchdog_seconds)  # the run replaces it with its started one
        self.harness_stats = HarnessStats()
        self.harness_errors = HarnessErrors(r.max_harness_errors, r.max_harness_error_rate, r.harness_error_window)
        self._tasks: set[asyncio.Task] = set()
        self.lead_limit = None  # () -> most episodes in flight + buffered (the run: what training can still use)
        self.gateway = None  # rollout.agent_gateway.AgentGateway: the run's, for harnesses that play themselves
        self.side_playing = 0  # episodes played outside the loop (evaluation, probes): not in `in_flight`
        self.seating = Seating(self)  # multi-agent harnesses: who plays each role

    def harness_pool(self, name: str) -> HarnessPool:
        """The pool of `name`'s instances (made on first use, up to its concurrency limit)."""
        if name not in self.pools:
            limit = self._limits.get(name, self.concurrency)
            self.pools[name] = HarnessPool(lambda: self._make(name), limit)
        return self.pools[name]

    def reward_source(self, name: str) -> str:
        """harnesses[].reward of `name` as resolved (a harness without an entry: its class's own)."""
        if name not in self._reward_sources:
            from harnesses.registry import reward_source

            hc = next((h for h in self.config.harnesses if h.name == name), None)
            self._reward_sources[name] = reward_source(hc if hc is not None else _Named(name))
        return self._reward_sources[name]

    # ---- one episode -----------------------------------------------------------------------------

    async def play(self, draw: Draw, *, temperature: float | None = None, store: bool = True, counted: bool = False):
        """Run, score and (with `store`) record one episode; returns (result, reward result, record).
        `counted`: the episode is in `in_flight` already (the loop's own). Traced with observe.traces.
        A multi-agent harness's episode is played, scored and stored for every policy role
        (`play_roles`); this returns the first policy role's."""
        if self.seating.is_multi(draw.task.harness):
            first = (await self.play_roles(draw, temperature=temperature, store=store, counted=counted))[0]
            return first.result, first.scored, first.record
        return await traces.episode(self.config.observe, self._play(draw, temperature, store, counted),
                                    trajectory_id=self.trajectory_id(draw), run_id=self.run_id, harness=draw.task.harness,
                                    task_id=draw.task.task_id, phase=self.phase)

    async def play_roles(self, draw: Draw, *, temperature: float | None = None, store: bool = True, counted: bool = False):
        """One episode of a multi-agent harness: a `multi_play.RolePlayed` per policy role."""
        return await traces.episode(self.config.observe, play_roles(self, draw, infra_lost, temperature=temperature, store=store,
                                                                    counted=counted),
                                    trajectory_id=self.trajectory_id(draw), run_id=self.run_id, harness=draw.task.harness,
                                    task_id=draw.task.task_id, phase=self.phase)

    async def _play(self, draw: Draw, temperature: float | None, store: bool, counted: bool):
        name = draw.task.harness
        played = settings(self, draw, temperature)
        busy = EnvBusy(self, name)
        while True:
            try:
                async with lend(self, name, counted) as lent:
                    if getattr(lent.harness, "plays_itself", False):
                        result = await play_agent(lent.harness, draw.task, self.gateway or getattr(lent.harness, "gateway", None),
                                                  self.executor, played)
                        self._mirror_gateway()
                    else:
                        result = await play_policy(lent.harness, draw.task, self.client, self.tokenizer, self.executor, played)
                    lent.played(result)
                    self.harness_errors.record(name, result, self.counters)
                break
            except EnvironmentBusy as refused:  # backpressure, never a harness error
                if not await busy.wait(refused):
                    result, lent = busy_too_long(draw, refused), Lent(None)
                    break
        count(self, result)
        tid = self.trajectory_id(draw)
        scored = await score(self, result, tid, played.reward_source, result.harness_reward)
        self.counters["tokens_generated"] += result.completion_tokens
        record = self.to_record(draw, result, scored, tid)
        account(self, name, lent, [record])
        keep(self, record, store)
        return result, scored, record

    def _mirror_gateway(self) -> None:
        """The gateway's counters as they stand (`gateway/…`; its own totals, not summed here)."""
        if self.gateway is not None:
            for key, value in self.gateway.stats().items():
                self.counters[key] = value

    def agent_allowance(self) -> int:
        """Episodes the run's gateway may have in flight (its sessions, and its calls): as many as the
        loop may run under its concurrency, the buffer's room and the lead limit, plus the evaluation
        and probe episodes playing now. Read from the gateway's thread: it only copies and counts."""
        buffered = len(self.buffer)
        room = min(self.concurrency, self.buffer.capacity - buffered)
        lead = self.lead_limit
        if lead is not None:
            room = min(room, lead() - self.buffer.usable(self._filling()))
        return max(0, room) + self.side_playing

    def train_reward(self, truncated: bool, masked: bool, reward: float) -> float | None:
        """The reward the trainer sees (None = masked): `rollout.truncation` decides for an episode cut
        at the step or sequence limit (mask, score, or penalize with -1); counted as `truncated_<mode>`."""
        if truncated and not masked:
            self.counters[f"truncated_{self.config.rollout.truncation}"] += 1
        return trained_reward(self.config.rollout.truncation, truncated, masked, reward)

    def reward_of_record(self, record) -> float | None:
        """`train_reward` for a stored trajectory (reloaded after a resume)."""
        return self.train_reward(record.outcome == Outcome.TRUNCATED, record.reward_status == RewardStatus.INFRA_ERROR,
                                 record.reward)

    def trajectory_id(self, draw: Draw) -> str:
        """Run, phase, group and sample: the same draw gets the same id after a resume, and the phases
        of one run (stage 0's baseline, stage 8's smoke and short) never share one."""
        return f"{self.run_id}-{self.phase}-{draw.group_id}-{draw.index}"

    def to_record(self, draw: Draw, result: EpisodeResult, scored, tid: str, *, role: str | None = None,
                  step_roles: list[str] | None = None):
        """The stored record of a played episode, built whole (its training arrays included); `role`:
        the policy role of a multi-agent episode it trains (its group the draw's with `/<role>`),
        `step_roles`: the role of each joint step."""
        return record_from_episode(result.trajectory, run_id=self.run_id, harness_version=_harness_version(draw.task.harness),
                                   reward=scored, evidence=result.evidence, termination=result.termination, seed=draw.seed,
                                   phase=self.phase, group_id=role_group(draw.group_id, role),
                                   task_set_version=self.task_set(draw.task.harness).version,
                                   weight_versions=result.weight_versions, trajectory_id=tid, step_times=result.step_times,
                                   token_ids=result.token_ids, loss_mask=result.loss_mask, logprobs=result.logprobs,
                                   prompt_tokens=result.prompt_tokens, completion_tokens=result.completion_tokens,
                                   segment_starts=result.segment_starts, step_rewards=result.step_rewards,
                                   max_output_bytes=self.config.data.max_tool_output_bytes, role=role, step_roles=step_roles)

    async def _episode_into_buffer(self, draw: Draw) -> None:
        key = _draw_key(draw)
        self.inflight_draws[key] = draw  # already there when started by `run`
        tid = self.trajectory_id(draw)
        try:
            if self.seating.is_multi(draw.task.harness):
                await self._roles_into_buffer(draw, tid)
                return
            if tid in self.stored_ids and self.fetch is not None:
                record = await asyncio.to_thread(self.fetch, tid)
                if record is not None:  # drawn again after a resume: reuse it, never store it twice
                    self.counters["reused_after_resume"] += 1
                    await self.buffer.put(Episode(draw.group_id, record, version_number(record.policy_version_first),
                                                  self.reward_of_record(record)))  # generated before the resume
                    return
            result, scored, record = await self.play(draw, counted=True)
            versions = [version_number(v) for v in result.weight_versions] or [0]
            if not scored.masked:  # a masked episode says nothing about the task's difficulty
                self.sampler.record(draw.task, scored.outcome == Outcome.SUCCESS)
            reward = self.train_reward(result.termination == Termination.TRUNCATED, scored.masked, scored.reward)
            await self.buffer.put(Episode(draw.group_id, record, min(versions), reward, tokens=result.completion_tokens))
            self.counters["tokens_buffered"] += result.completion_tokens
        except Exception as exc:  # noqa: BLE001 - one broken episode must not stop the rollout
            self.counters["episode_errors"] += 1
            log.exception("episode %s/%s failed: %s", draw.group_id, draw.index, exc)
        finally:
            self.inflight_draws.pop(key, None)
            self.in_flight -= 1

    async def _roles_into_buffer(self, draw: Draw, tid: str) -> None:
        """A multi-agent draw: one buffered episode per policy role, in the role's group (reused from
        the store after a resume when every role's record is there)."""
        roles = self.seating.policy_roles(draw.task.harness)
        tids = [role_trajectory_id(tid, r) for r in roles]
        if self.fetch is not None and all(t in self.stored_ids for t in tids):
            records = [await asyncio.to_thread(self.fetch, t) for t in tids]
            if all(r is not None for r in records):
                for record in records:
                    self.counters["reused_after_resume"] += 1
                    versions = [version_number(s.weight_version) for s in record.steps if s.weight_version] or [0]
                    await self.buffer.put(Episode(record.group_id, record, min(versions), self.reward_of_record(record)))
                return
        played = await self.play_roles(draw, counted=True)
        first = played[0].scored
        if not first.masked:
            self.sampler.record(draw.task, first.outcome == Outcome.SUCCESS)
        moved = [version_number(v) for p in played for v in p.result.weight_versions if v]  # any policy role's
        for p in played:
            versions = [version_number(v) for v in p.result.weight_versions if v] or moved or [0]
            reward = self.train_reward(p.result.termination == Termination.TRUNCATED, p.scored.masked, p.scored.reward)
            if not p.result.completion_tokens:  # the role never moved (another held the turn): nothing of it to train
                reward = None
                self.counters["roles_without_moves"] += 1
            await self.buffer.put(Episode(p.record.group_id, p.record, min(versions), reward, tokens=p.result.completion_tokens))
            self.counters["tokens_buffered"] += p.result.completion_tokens

    # ---- the loop ----------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event, max_groups: int | None = None) -> None:
        """Start groups until `stop` is set (or `max_groups` were started), with backpressure."""
        groups = 0
        while not stop.is_set():
            if not self.starting:
                if max_groups is not None and groups >= max_groups:
                    break
                g = self.sampler.group_size
                if self.pending:  # restored from a snapshot: these first
                    self.starting, self.pending = self.pending[:g], self.pending[g:]
                else:
                    self.starting = self.sampler.next_group()
                groups += 1
            # one episode at a time: a whole group may not fit (concurrency or buffer below the group size)
            ahead = self.in_flight + len(self.buffer)
            if (self.in_flight >= self.concurrency or ahead >= self.buffer.capacity
                    or (self.lead_limit is not None and self._lead() >= self.lead_limit())
                    or self._inference_queue() > self.config.rollout.max_inference_queue):
                self.counters["backpressure_waits"] += 1
                await asyncio.sleep(0.01)
                continue
            # in flight from this moment, not from the task's first step: a checkpoint taken before
            # the task runs must find the draw, and the lead must count its buffered siblings
            draw = self.starting.pop(0)
            self.inflight_draws[_draw_key(draw)] = draw
            self.in_flight += 1
            self.counters["in_flight_peak"] = max(self.counters["in_flight_peak"], self.in_flight)
            self.counters["held_peak"] = max(self.counters["held_peak"], ahead + 1)  # in flight + buffered: highest at a start
            task = asyncio.create_task(self._episode_into_buffer(draw))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def _lead(self) -> int:
        """Episodes in flight plus the buffered ones that can still be trained."""
        return self.in_flight + self.buffer.usable(self._filling())

    def _filling(self) -> set[str]:
        """Groups with members still to finish: in flight, about to start, or restored to run first.
        Safe to call from another thread (the gateway's admission): it only copies."""
        draws = [*list(self.inflight_draws.values()), *list(self.starting), *list(self.pending)]
        return {g for d in draws for g in self.seating.groups(d.group_id, d.task.harness)}

    def _inference_queue(self) -> int:
        """Generation requests in flight to the inference servers."""
        return sum(getattr(self.client, "in_flight", {}).values())

    async def evaluate(self, tasks, temperature: float = 0.0, limit: asyncio.Semaphore | None = None) -> dict:
        """Success rate of `tasks` (greedy by default); not stored, not buffered. `limit` bounds the
        episodes in flight (shared by calls that should not overlap)."""
        async def one(i: int, t):
            if limit is None:
                return await self.play(Draw(t, f"eval-{i}", 0, i), temperature=temperature, store=False)
            async with limit:
                return await self.play(Draw(t, f"eval-{i}", 0, i), temperature=temperature, store=False)
        results = await asyncio.gather(*(one(i, t) for i, t in enumerate(tasks)), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        for exc in errors[:3]:
            log.error("evaluation episode failed: %r", exc)
        won = [not isinstance(r, BaseException) and r[1].outcome == Outcome.SUCCESS for r in results]
        by_family: dict[str, list[int]] = {}
        for t, w in zip(tasks, won):
            by_family.setdefault(t.meta.get("family", ""), [0, 0])[w] += 1
        return {"n": len(tasks), "success": sum(won), "success_rate": sum(won) / len(tasks) if tasks else 0.0, "errors": len(errors),
                "by_family": {f: f"{n[1]}/{n[0] + n[1]}" for f, n in sorted(by_family.items())}}

    def snapshot(self) -> list[dict]:
        """The episodes drawn but not finished (in flight, or waiting to start): a resumed controller
        runs them again first (same group ids, so the same trajectory ids), so none is lost and none
        is stored twice."""
        draws = {(d.group_id, d.index): d for d in [*self.inflight_draws.values(), *self.starting, *self.pending]}
        return [{"task_id": d.task.task_id, "harness": d.task.harness, "group_id": d.group_id, "index": d.index,
                 "seed": d.seed} for _, d in sorted(draws.items())]

    def task_set(self, harness: str):
        """The configured harness's task set (its `tasks` file, its own, or the committed one)."""
        hc = next((h for h in self.config.harnesses if h.name == harness), None)
        return task_set(hc, self.config.data) if hc is not None else task_set(_Named(harness))

    def restore(self, snapshot: list[dict]) -> None:
        by_id = {}
        for item in snapshot:
            if item["harness"] not in by_id:
                by_id[item["harness"]] = {t.task_id: t for t in self.task_set(item["harness"]).tasks}
        self.pending = [Draw(by_id[i["harness"]][i["task_id"]], i["group_id"], i["index"], i["seed"]) for i in snapshot]

    def close(self) -> None:
        if self.seating.opponents:  # fixed opponents' clients: closed on the loop they were used on, if it runs
            try:
                asyncio.get_running_loop().create_task(self.seating.aclose())
            except RuntimeError:
                log.warning("fixed opponents' inference clients left open: no event loop runs to close them on")
        for pool in self.pools.values():
            pool.close()
        self.executor.shutdown(wait=False, cancel_futures=True)


def _draw_key(draw: Draw) -> str:
    return f"{draw.group_id}-{draw.index}"


def trained_reward(truncation: str, truncated: bool, masked: bool, reward: float) -> float | None:
    """What the trainer sees of an episode's reward; None = masked (never trained on)."""
    if masked:
        return None
    if not truncated:
        return reward
    return {"mask": None, "score": reward, "penalize": TRUNCATION_PENALTY}[truncation]


class _Named:
    """A harness known only by name (no `harnesses[]` entry): its own or the committed tasks."""

    def __init__(self, name: str) -> None:
        self.name, self.tasks = name, None


def _harness_version(name: str) -> str:
    from harnesses.registry import harness_version

    return harness_version(name)
