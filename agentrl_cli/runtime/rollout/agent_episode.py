"""One episode of a harness that plays itself (`plays_itself`, the `agent` harness): reset it, open a
session on the run's gateway, let the harness run its agent with that session (in the harness
thread: an entry function on a private event loop, a command in a sandbox), close the session, and
build the `EpisodeResult` the controller stores and scores like any other.

From the session's record (`gateway.record.SessionRecord`): the trajectory (the task as the first
observation; each call's choice a step, its action the assistant's text and tool calls, its
observation the messages the agent added before its next call, the tool results among them as the
step's tool calls; the last step's observation the final answer, done), the evidence (final answer,
files), the training arrays of every segment one after the other with `segment_starts` when there
are several (an agent that rewrote its history trains one sample per segment, all sharing the
episode's advantage), the weight version and any posted reward of each call, and the token counts
(`prompt_tokens`: ids not generated; `completion_tokens`: ids generated, over all segments). A step
whose call held a tool call the model wrote and the parser refused (`gateway/malformed_tool_calls`)
is stored with observation status `invalid_action`, so the trajectory's `invalid_actions` counts it.

Termination: done; `timeout` past the harness's deadline (scored, as a step timeout is); an agent
that raised or exited non-zero is the harness's failure (`harness_failed(result, "agent", exc)`:
masked, counted), unless the gateway was refusing its calls (the run's staleness limit: masked as
`gateway_backpressure`, not the harness's doing); a streamed call the agent went away from
mid-stream (aborted, not recorded): `infra_error` masked (`stream_aborted`), never a half-recorded
step; no call at all: `infra_error` masked (`agent_made_no_call`). Counters: `token_exact_episodes` / `token_exact_mismatches` (the stored ids
against the served ones), `agent_calls`, `agent_segments`, `agent_non_prefix_calls`.

This is the one episode loop (`episode_loop.play_episode`: reset with its retries, evidence and
reward collected as for any harness) with the agent's session as its actor (`AgentTurns`).
"""

from __future__ import annotations

import json
from dataclasses import replace

from agentrl_cli.core.episode import HarnessReward, Observation, ToolCallResult, Trajectory
from agentrl_cli.core.outcomes import Termination
from agentrl_cli.runtime.data.schema import utcnow
from agentrl_cli.runtime.rollout.episode_loop import EpisodeResult, Settings, harness_failed, play_episode


def _observation(step, final: bool, answer: str | None) -> Observation:
    """The observation after one call: the messages the next call added (tool results as calls);
    `invalid_action` when the model wrote a tool call the parser refused (named in `info`)."""
    seen = _seen(step, final, answer)
    malformed = list(getattr(step, "malformed_tool_calls", None) or ())
    if malformed:
        seen.status, seen.info = "invalid_action", {**seen.info, "malformed_tool_calls": malformed}
    return seen


def _seen(step, final: bool, answer: str | None) -> Observation:
    if not step.observation:
        if final:
            return Observation(text=answer or "", status="ok" if answer else "empty", done=True,
                               info={"final_answer": answer})
        return Observation(text="", status="empty", info={"history_rewritten": True})
    names = {c.get("id", ""): c for c in step.tool_calls}
    calls = []
    for m in step.observation:
        if isinstance(m, dict) and m.get("role") == "tool":
            call = names.get(m.get("tool_call_id") or "", {})
            try:
                arguments = json.loads(call.get("arguments") or "{}")
            except ValueError:
                arguments = {"_raw": call.get("arguments")}
            calls.append(ToolCallResult(name=call.get("name") or str(m.get("name") or "tool"),
                                        arguments=arguments if isinstance(arguments, dict) else {"_raw": arguments},
                                        output=str(m.get("content") or "")))
    text = step.observation_text()
    return Observation(text=text, status="ok" if text.strip() else "empty", calls=calls)


def fill_from_record(result: EpisodeResult, record, answer: str | None) -> None:
    """The trajectory's steps, the training arrays and the counts of `record` into `result`."""
    steps = sorted((s for seg in record.segments for s in seg.calls), key=lambda s: (s.index, s.choice))
    for i, step in enumerate(steps):
        result.trajectory.actions.append(step.action())
        result.trajectory.observations.append(_observation(step, i == len(steps) - 1, answer))
        result.weight_versions.append(step.weight_version)
        result.step_rewards.append(step.reward)
    starts = []
    for seg in record.segments:
        starts.append(len(result.token_ids))
        result.token_ids += list(seg.token_ids)
        result.loss_mask += list(seg.loss_mask)
        result.logprobs += list(seg.logprobs)
    result.segment_starts = starts if len(starts) > 1 else []
    result.completion_tokens = sum(result.loss_mask)
    result.prompt_tokens = len(result.loss_mask) - result.completion_tokens
    result.counters["agent_calls"] += record.counters.get("calls", 0)
    result.counters["agent_non_prefix_calls"] += record.counters.get("non_prefix_calls", 0)
    result.counters["agent_segments"] += len(record.segments)


class AgentTurns:
    """The loop's `Actor` for a harness that plays itself: one session on the run's gateway, the
    agent run with it (in the harness thread), the session's record read into the result."""

    def __init__(self, gateway) -> None:
        self.gateway = gateway
        self.record = None  # the session's record (gateway.record.SessionRecord), once closed

    async def act(self, ep, first) -> bool:
        result, harness, gateway = ep.result, ep.harness, self.gateway
        timeout_s = float(getattr(harness, "timeout_s", 300.0))
        try:
            session = await gateway.open({"task_id": ep.task.task_id, "harness": ep.task.harness}, timeout_s)
        except TimeoutError as exc:  # the run's limit refused a session all along: nobody's fault, masked
            result.termination, result.infra_flag, result.error = Termination.INFRA_ERROR, "gateway_backpressure", str(exc)
            return False
        reward = gateway.reward_access(session.id) if ep.settings.reward_source != "verifiers" else None
        refused, failure, started = gateway.refused_calls(), None, utcnow()
        try:
            outcome = await ep.call(harness.play, session.base_url, session.key, reward)
        except Exception as exc:  # noqa: BLE001 - sorted below: a timeout, the run's backpressure, or the agent's failure
            outcome, failure = None, exc
        finally:
            await gateway.settle(session.id)
            self.record = record = gateway.close(session.id)
        answer = outcome.answer if outcome is not None else None
        if record is not None:
            fill_from_record(result, record, answer)
            result.step_times = [(started, utcnow())] * len(result.trajectory.actions)
            checked, mismatches = gateway.tap.check(record)
            result.counters["token_exact_episodes"] += 1 if checked else 0
            result.counters["token_exact_mismatches"] += mismatches
        if record is not None and record.counters.get("aborted_calls"):
            result.termination, result.infra_flag = Termination.INFRA_ERROR, "stream_aborted"
            result.error = (f"the agent went away mid-stream from {record.counters['aborted_calls']} call(s): those "
                            "generations were aborted and not recorded, so the episode has no complete record"
                            + (f" (the agent then failed: {failure})" if failure is not None else ""))
            return False
        if failure is not None:
            if isinstance(failure, TimeoutError):  # the harness's deadline (harnesses.agent.runners.AgentTimeout)
                result.termination, result.error = Termination.TIMEOUT, str(failure)
            elif gateway.refused_calls() > refused:
                result.termination, result.infra_flag = Termination.INFRA_ERROR, "gateway_backpressure"
                result.error = f"the agent failed while the run's gateway refused calls (staleness limit): {failure}"
                return False
            else:
                harness_failed(result, "agent", failure)
                return False
        if not result.trajectory.actions:
            result.termination, result.infra_flag = Termination.INFRA_ERROR, "agent_made_no_call"
            result.error = ("the agent made no call to the model through its session"
                            if record is not None else "the agent's session expired (gateway.session_ttl_s) before it ended")
            return False
        return True

    def close(self, ep) -> None:
        """Nothing to close: the gateway's tap checked the served ids against the stored ones."""

    async def score(self, ep) -> None:
        """The harness's reward (the one the agent posted) when the config asks for it."""
        if ep.settings.reward_source == "verifiers":
            return
        take = getattr(ep.harness, "take_rewards", None)
        if take is not None:
            take(self.record.rewards.episode)
        ep.result.harness_reward = await ep.harness_reward("compute_reward", HarnessReward.of)


async def run_agent_episode(harness, task, gateway, executor, *, reward_source: str = "verifiers", watchdog=None,
                            stats=None, create_retries: int = 0, create_backoff_s: float = 0.5) -> EpisodeResult:
    """`gateway`: the run's `AgentGateway`. `reward_source` `harness`: the agent may post the episode's
    reward, which becomes the harness's `compute_reward`. A creation (`reset`) that raises is retried
    `create_retries` times with doubling backoff. The agent keeps its own deadline (the harness's
    `timeout_s`): no step deadline applies to its calls."""
    settings = Settings(reward_source=reward_source, watchdog=watchdog, stats=stats, create_retries=create_retries,
                        create_backoff_s=create_backoff_s)
    return await play_agent(harness, task, gateway, executor, settings)


async def play_agent(harness, task, gateway, executor, settings: Settings) -> EpisodeResult:
    """`run_agent_episode` with its settings in one object (what the controller passes); the step
    deadline and the sampling settings do not apply (the agent keeps its own)."""
    if gateway is None:
        raise RuntimeError(f"harness {task.harness!r} plays its episodes through the run's gateway, which this rollout "
                           "was not given (a training run starts it for harnesses with needs_gateway)")
    result = EpisodeResult(trajectory=Trajectory(task=task), evidence=None, termination=Termination.DONE)
    return await play_episode(harness, task, AgentTurns(gateway), executor, replace(settings, step_timeout_s=None), result)
