"""What the rollout controller does around every episode, whoever plays it (the policy, an agent
through the gateway, the seats of a multi-agent harness), written once: lend a harness instance
from its pool for the episode (`lend`: a side episode unless the loop's own, watched as "rollout",
its `end_episode` called and its sandbox's use read before it goes back), the episode's settings
from the config (`settings`), counting it (`count`), scoring it (`score`: masked when the
infrastructure lost it), putting the harness's tool calls and resources on its records (`account`)
and storing them (`keep`).

Belongs here: the controller's side of one episode. Not here: playing it (`episode_loop.py` and its
actors), the loop that starts episodes and fills the buffer (`controller.py`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass

from agentrl_cli.core.outcomes import Outcome, RewardStatus, Termination
from agentrl_cli.runtime.observe import traces
from agentrl_cli.runtime.reward.models import RewardResult
from agentrl_cli.runtime.reward.request_from_episode import request_from_episode
from agentrl_cli.runtime.rollout.episode_loop import ABANDONED, Settings

log = logging.getLogger(__name__)


def infra_lost(tid: str, why: str, flag: str = "inference_unavailable") -> RewardResult:
    """The result of an episode the infrastructure could not finish (its generation lost, or its
    environment never created): masked (infra_error), never a zero score."""
    return RewardResult(trajectory_id=tid, reward=0.0, components={}, status=RewardStatus.INFRA_ERROR, outcome=Outcome.ERROR,
                        verifier="none", verifier_versions={}, flags=["infra_error", flag], detail=why)


@dataclass
class Lent:
    """A harness instance lent to one episode; `resources`: its sandbox's use, read when it went back;
    `image_digest`: the image its sandbox ran in ("" = the host root, or no sandbox)."""

    harness: object
    resources: dict | None = None
    image_digest: str = ""
    abandoned: int = 0  # calls of the episode still running past their deadline: retire the instance

    def played(self, result) -> None:
        """Note what the episode's `result` says about the instance (calls left running)."""
        self.abandoned += result.counters.get(ABANDONED, 0)


@asynccontextmanager
async def lend(ctrl, name: str, counted: bool):
    """A `Lent` harness of `name` from the controller's pool for one episode. `counted`: the episode
    is in `in_flight` already (the loop's own); otherwise it counts in `side_playing` meanwhile."""
    loop = asyncio.get_running_loop()
    pool = ctrl.harness_pool(name)
    ctrl.side_playing += not counted
    try:
        harness = await pool.acquire(loop, ctrl.executor)
    except BaseException:
        ctrl.side_playing -= not counted
        raise
    lent = Lent(harness)
    ctrl.watchdog.begin("rollout")
    try:
        yield lent
    finally:
        ctrl.side_playing -= not counted
        if lent.abandoned:  # its thread still runs a call: closed beside it (which may end the call), never reused
            pool.retire(harness)
        else:
            await give_back(ctrl, pool, lent, name)
        ctrl.watchdog.end("rollout")


async def give_back(ctrl, pool, lent: Lent, name: str) -> None:
    """Return a lent instance to its pool: its `end_episode` called (optional: frees the episode's
    resources, its sandbox, now) and its sandbox's use and image read first."""
    harness = lent.harness
    end = getattr(harness, "end_episode", None)
    if end is not None:
        try:
            await asyncio.get_running_loop().run_in_executor(ctrl.executor, end)
        except Exception:  # noqa: BLE001 - the next reset releases them anyway
            log.exception("ending the episode of %s failed", name)
    lent.resources = getattr(harness, "episode_resources", None)  # its sandbox's use, read before destroying it
    lent.image_digest = getattr(harness, "episode_image_digest", "") or ""
    pool.release(harness)


def settings(ctrl, draw, temperature: float | None) -> Settings:
    """How the controller plays `draw`: the config's limits, the controller's temperature unless one
    is given, the draw's seed, the controller's resume policy, watchdog and statistics."""
    r = ctrl.config.rollout
    return Settings(max_steps=r.max_steps_per_trajectory, step_timeout_s=r.step_timeout_seconds,
                    max_new_tokens=ctrl.config.inference.max_new_tokens,
                    temperature=ctrl.temperature if temperature is None else temperature, seed=draw.seed,
                    context_limit=ctrl.config.training.seq_len_limit, create_retries=r.env_create_retries,
                    create_backoff_s=r.env_create_backoff_s, reward_source=ctrl.reward_source(draw.task.harness),
                    resume=ctrl.resume, on_recovered=ctrl.on_recovered, watchdog=ctrl.watchdog, stats=ctrl.harness_stats)


def count(ctrl, result) -> None:
    """The episode's counters, its termination, its environment calls and its times."""
    ctrl.counters.update(result.counters)
    ctrl.counters[f"termination_{result.termination}"] += 1
    ctrl.counters["env_calls"] += len(result.trajectory.observations)  # reset + steps
    ctrl.timers["generate_s"] += result.generate_s
    ctrl.timers["env_s"] += result.env_s


async def score(ctrl, result, tid: str, reward_source: str, harness_reward, lost=infra_lost) -> RewardResult:
    """The reward service's result for the episode, or `lost(tid, why, flag)` (masked) when the
    infrastructure could not finish it (the flag: the result's own, else environment_unavailable,
    harness_error or inference_unavailable)."""
    t = time.perf_counter()
    if result.termination == Termination.INFRA_ERROR:
        why = getattr(result, "infra_flag", "") or (
            "environment_unavailable" if result.counters.get("env_create_failures")
            else "harness_error" if result.harness_error else "inference_unavailable")
        scored = lost(tid, result.error, why)
    else:
        ctrl.watchdog.begin("reward")
        scored = None
        try:
            scored = await traces.child("reward", ctrl.reward.ascore(request_from_episode(
                result.trajectory, result.evidence, trajectory_id=tid, termination=result.termination,
                reward_source=reward_source, harness_reward=harness_reward)), after=traces.reward_attributes)
        finally:
            ctrl.watchdog.end("reward", ok=scored is not None and "reward_service_unreachable" not in scored.flags)
        ctrl.counters[f"reward_{scored.status}"] += 1
    ctrl.timers["reward_s"] += time.perf_counter() - t
    return scored


def account(ctrl, name: str, lent: Lent, records: list) -> None:
    """The sandbox's use and image on every record of the episode, and its harness statistics (the
    tool calls of its steps, its resources) counted once."""
    if not records:
        return
    for record in records:
        record.image_digest = lent.image_digest
    if lent.resources:
        for record in records:
            record.env_resources = lent.resources
        ctrl.harness_stats.record_resources(getattr(lent.harness, "name", name), lent.resources)  # as the loop names it
    for step in records[0].steps:
        for call in step.tool_calls:
            ctrl.harness_stats.record_tool(name, call.name, call.status, seconds=call.latency_ms / 1000)


def keep(ctrl, record, store: bool) -> None:
    """Write `record` to the trajectory store (with `store`, when the controller has a writer)."""
    if store and ctrl.writer is not None:
        t = time.perf_counter()
        ctrl.writer.write(record)
        ctrl.timers["store_s"] += time.perf_counter() - t
