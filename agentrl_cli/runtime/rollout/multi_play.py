"""The rollout controller's side of multi-agent harnesses (`harnesses.multi_agent`): who plays each
role (`Seating`, from `harnesses[].roles`), and `play_roles`, which plays one episode
(`multi_episode.run_multi_episode`) and scores, records and stores it once per role the policy plays.

Each policy role's record holds the whole joint episode (every role's moves, each step with its
`role`) and that role's own training sequence; its trajectory id is the draw's with `-<role>`, its
GRPO group the draw's group with `/<role>` (`multi_agent.role_group`), its reward that role's score
from `role_rewards`, sent through the reward service as the harness's score (reward source
`harness`: a multi-agent harness is scored by its roles' rewards only). Roles seated `scripted`
or at a fixed opponent's server are played, never recorded as trained sequences.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from agentrl_cli.runtime.data.record_from_episode import record_from_episode
from agentrl_cli.core.outcomes import Termination
from agentrl_cli.runtime.reward.request_from_episode import request_from_episode
from agentrl_cli.runtime.rollout.multi_episode import Seat, run_multi_episode
from agentrl_cli.runtime.rollout.run_episode import EpisodeResult
from harnesses.multi_agent import POLICY, SCRIPTED, is_multi_agent, policy_roles, require_harness_reward, role_group, seats

log = logging.getLogger(__name__)


@dataclass
class RolePlayed:
    role: str
    result: EpisodeResult  # the role's view: the joint trajectory, its own tokens
    scored: object  # RewardResult
    record: object  # TrajectoryRecord


class Seating:
    """Per harness name: whether it is multi-agent, and its roles' seats (validated once; ConfigError)."""

    def __init__(self, controller) -> None:
        self.ctrl = controller
        self._multi: dict[str, bool] = {}
        self._seats: dict[str, dict[str, str]] = {}
        self.opponents: dict[str, object] = {}  # url -> InferenceClient

    def is_multi(self, name: str) -> bool:
        if name not in self._multi:
            from harnesses.registry import resolve

            self._multi[name] = is_multi_agent(resolve(name))
        return self._multi[name]

    def seats(self, name: str) -> dict[str, str]:
        if name not in self._seats:
            from harnesses.registry import resolve

            hc = next((h for h in self.ctrl.config.harnesses if h.name == name), None)
            seated = seats(resolve(name), getattr(hc, "roles", None), name)
            if seated:
                require_harness_reward(name, self.ctrl.reward_source(name))
            self._seats[name] = seated
        return self._seats[name]

    def policy_roles(self, name: str) -> list[str]:
        return policy_roles(self.seats(name))

    def groups(self, group_id: str, name: str) -> list[str]:
        """The buffer's groups a draw of `name` fills: one per policy role (one, the draw's, for a single-agent harness)."""
        return [role_group(group_id, r) for r in self.policy_roles(name)] if self.is_multi(name) else [group_id]

    def client(self, seat: str):
        if seat == POLICY:
            return self.ctrl.client
        if seat not in self.opponents:
            from agentrl_cli.engines.inference.client import InferenceClient

            self.opponents[seat] = InferenceClient(seat, timeout_s=self.ctrl.config.rollout.step_timeout_seconds)
        return self.opponents[seat]

    def make_seats(self, name: str) -> dict[str, Seat]:
        return {role: Seat(role, seat, None if seat == SCRIPTED else self.client(seat)) for role, seat in self.seats(name).items()}

    async def aclose(self) -> None:
        for client in self.opponents.values():
            await client.close()
        self.opponents.clear()


def role_trajectory_id(base: str, role: str) -> str:
    return f"{base}-{role}"


async def play_roles(ctrl, draw, lost, *, temperature: float | None = None, store: bool = True,
                     counted: bool = False) -> list[RolePlayed]:
    """Play, score and (with `store`) record one episode of a multi-agent harness; one RolePlayed per
    policy role, in the harness's role order. `lost(tid, why, flag)`: the masked result of an episode
    the infrastructure could not finish (`controller.infra_lost`); `counted`: as `RolloutController.play`."""
    name = draw.task.harness
    seated = ctrl.seating.make_seats(name)
    loop = asyncio.get_running_loop()
    pool = ctrl._pool(name)
    ctrl.side_playing += not counted
    try:
        harness = await pool.acquire(loop, ctrl.executor)
    except BaseException:
        ctrl.side_playing -= not counted
        raise
    r = ctrl.config.rollout
    ctrl.watchdog.begin("rollout")
    try:
        played = await run_multi_episode(harness, draw.task, seated, ctrl.tokenizer, ctrl.executor,
                                         max_steps=r.max_steps_per_trajectory, step_timeout_s=r.step_timeout_seconds,
                                         max_new_tokens=ctrl.config.inference.max_new_tokens,
                                         temperature=ctrl.temperature if temperature is None else temperature,
                                         seed=draw.seed, context_limit=ctrl.config.training.seq_len_limit,
                                         resume=ctrl.resume, on_recovered=ctrl.on_recovered, watchdog=ctrl.watchdog,
                                         stats=ctrl.harness_stats)
        ctrl.harness_errors.record(name, played, ctrl.counters)  # the run's error budget, as for any harness
    finally:
        ctrl.side_playing -= not counted
        end = getattr(harness, "end_episode", None)  # optional: free the episode's resources now
        if end is not None:
            try:
                await loop.run_in_executor(ctrl.executor, end)
            except Exception:  # noqa: BLE001 - the next reset releases them anyway
                log.exception("ending the episode of %s failed", name)
        pool.release(harness)
        ctrl.watchdog.end("rollout")
    ctrl.counters.update(played.counters)
    ctrl.counters[f"termination_{played.termination}"] += 1
    ctrl.counters["env_calls"] += len(played.trajectory.observations)
    ctrl.timers["generate_s"] += played.generate_s
    ctrl.timers["env_s"] += played.env_s
    base = ctrl.trajectory_id(draw)
    out = []
    for role in policy_roles(ctrl.seating.seats(name)):
        result = played.role_result(role)
        tid = role_trajectory_id(base, role)
        t = time.perf_counter()
        if played.termination == Termination.INFRA_ERROR:
            scored = lost(tid, played.error, "harness_error" if played.harness_error else "inference_unavailable")
        else:
            scored = await ctrl.reward.ascore(request_from_episode(
                played.trajectory, played.evidence, trajectory_id=tid, termination=played.termination,
                reward_source="harness", harness_reward=played.role_rewards.get(role)))
            ctrl.counters[f"reward_{scored.status}"] += 1
        ctrl.timers["reward_s"] += time.perf_counter() - t
        ctrl.counters["tokens_generated"] += result.completion_tokens
        record = record_from_episode(
            played.trajectory, run_id=ctrl.run_id, harness_version=_harness_version(name), reward=scored,
            evidence=played.evidence, termination=played.termination, seed=draw.seed, phase=ctrl.phase,
            group_id=role_group(draw.group_id, role), task_set_version=ctrl.task_set(name).version,
            weight_versions=result.weight_versions, trajectory_id=tid, step_times=played.step_times,
            token_ids=result.token_ids, loss_mask=result.loss_mask, logprobs=result.logprobs,
            prompt_tokens=result.prompt_tokens, completion_tokens=result.completion_tokens,
            max_output_bytes=ctrl.config.data.max_tool_output_bytes, role=role, step_roles=played.step_roles)
        if store and ctrl.writer is not None:
            t = time.perf_counter()
            ctrl.writer.write(record)
            ctrl.timers["store_s"] += time.perf_counter() - t
        out.append(RolePlayed(role, result, scored, record))
    return out


def _harness_version(name: str) -> str:
    from harnesses.registry import harness_version

    return harness_version(name)
