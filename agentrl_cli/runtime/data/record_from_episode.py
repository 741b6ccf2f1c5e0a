"""From a finished harness episode to the stored `TrajectoryRecord`, built whole in one call: steps
with their observations, statuses and tool calls (`agentrl_cli.core.episode.calls_of`), the evidence the
verifier saw (as artifacts), the reward and its components, the outcome, the counts the metrics and
queries use, and the training arrays (token ids, loss mask, log-probs) when the rollout has them.

A stored call counts as failed (`tool_failures`) when its status is one of FAILED_CALL, or when it
is `ok` but the command it ran exited non-zero (its status is stored as `error`). Statuses and the
phase are stored as plain strings (their enums' values).

A call's output is what its harness reported on the call (`ToolCallResult.output`, for the sandboxed
harnesses the call's observation text, already clipped by the harness to what the agent was shown);
a call reported without one that is its step's only call gets the step's observation text. It is
stored clipped to `max_output_bytes` of UTF-8 (never inside a character), with the whole output's
size in bytes and its sha256."""

from __future__ import annotations

import hashlib
import math
import json

import numpy as np

from agentrl_cli.runtime.data.schema import Artifact, StepRecord, ToolCallRecord, TrajectoryRecord, utcnow
from agentrl_cli.core.episode import Evidence, Observation, Trajectory, calls_of
from agentrl_cli.core.outcomes import Outcome, Phase, Termination

FAILED_CALL = ("error", "timeout", "rate_limited", "invalid_action")
DEFAULT_MAX_OUTPUT_BYTES = 16384  # data.max_tool_output_bytes' default


def clip_output(text: str, max_bytes: int) -> tuple[str, int, str]:
    """(`text` clipped to `max_bytes` of UTF-8 without splitting a character, the whole text's size
    in UTF-8 bytes, its sha256 hex digest)."""
    data = text.encode("utf-8", "surrogatepass")
    clipped = data[:max(0, max_bytes)].decode("utf-8", "ignore") if len(data) > max_bytes else text
    return clipped, len(data), hashlib.sha256(data).hexdigest()


def _tool_calls(observation: Observation, max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES) -> list[ToolCallRecord]:
    out = []
    calls = calls_of(observation)
    for c in calls:
        status = "error" if c.status == "ok" and c.exit_code not in (None, 0) else c.status
        output = c.output or (observation.text if len(calls) == 1 else "")
        clipped, size, digest = clip_output(output, max_output_bytes)
        out.append(ToolCallRecord(name=c.name, arguments=json.dumps(c.arguments, default=str), status=status,
                                  latency_ms=float(c.latency_ms), retries=int(c.retries), exit_code=c.exit_code,
                                  output=clipped, output_bytes=size, output_sha256=digest))
    return out


def _arrays(token_ids, loss_mask, logprobs, segment_starts) -> dict:
    given = {"token_ids": (token_ids, np.int32), "loss_mask": (loss_mask, np.int8), "logprobs": (logprobs, np.float32),
             "segment_starts": (segment_starts, np.int32)}
    return {k: np.asarray(v, dtype=dtype) for k, (v, dtype) in given.items() if v is not None}


def record_from_episode(traj: Trajectory, *, run_id: str, harness_version: str, reward=None,
                        evidence: Evidence | None = None, termination: str = Termination.DONE, seed: int = 0,
                        phase: str = Phase.TRAIN, group_id: str = "", task_set_version: str = "",
                        weight_versions: list[str] | None = None, trajectory_id: str | None = None,
                        step_times: list[tuple] | None = None, token_ids=None, loss_mask=None, logprobs=None,
                        prompt_tokens: int = 0, completion_tokens: int = 0, segment_starts=None,
                        step_rewards: list[float | None] | None = None,
                        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES, role: str | None = None,
                        step_roles: list[str] | None = None) -> TrajectoryRecord:
    """`reward` is a RewardResult (or None: unscored). `step_times[i]` = (started, ended) of step i.
    `token_ids`, `loss_mask`, `logprobs`: the episode's training sequence, stored as numpy arrays
    (None: the episode has none, e.g. one played by a script); `segment_starts`: where each of its
    training samples starts when it is several (None or empty: one). `step_rewards[i]`: a reward
    given to step i alone (a gateway call's posted reward); where it is None, the step's observation's
`info["reward"]` when the harness reported one (an OpenEnv server's step reward), else 0.0. `max_output_bytes`: each
    tool call's output is stored clipped to this (`data.max_tool_output_bytes`). `role`: the role whose
    training sequence this is, in an episode of several roles; `step_roles[i]`: the role that acted at step i."""
    task = traj.task
    steps = []
    for i, action in enumerate(traj.actions):
        obs = traj.observations[i + 1] if i + 1 < len(traj.observations) else None
        started, ended = step_times[i] if step_times and i < len(step_times) else (utcnow(), utcnow())
        steps.append(StepRecord(index=i, action=action.text, observation=obs.text if obs else "",
                                observation_status=obs.status if obs else "error",
                                tool_calls=_tool_calls(obs, max_output_bytes) if obs else [],
                                weight_version=(weight_versions[i] if weight_versions and i < len(weight_versions) else ""),
                                reward=_step_reward(step_rewards[i] if step_rewards and i < len(step_rewards) else None, obs),
                                started_at=started, ended_at=ended,
                                role=step_roles[i] if step_roles and i < len(step_roles) else None))
    calls = [c for s in steps for c in s.tool_calls]
    evidence = evidence or Evidence()
    artifacts = [Artifact(path=p, sha256=None if data is None else hashlib.sha256(data).hexdigest(),
                          content=None if data is None else data.decode("utf-8", "replace"))
                 for p, data in sorted(evidence.files.items())]
    versions = [s.weight_version for s in steps if s.weight_version]
    kwargs = {} if trajectory_id is None else {"trajectory_id": trajectory_id}
    return TrajectoryRecord(
        run_id=run_id, task_id=task.task_id, harness=task.harness, harness_version=harness_version,
        task_type=str(task.meta.get("family", "")), task_set_version=task_set_version, split=task.split, phase=str(phase),
        group_id=group_id, seed=seed, policy_version_first=versions[0] if versions else "",
        policy_version_last=versions[-1] if versions else "",
        initial_observation=traj.observations[0].text if traj.observations else "",
        steps=steps, final_answer=evidence.final_answer, artifacts=artifacts,
        reward=float(reward.reward) if reward is not None else 0.0,
        reward_components=dict(reward.components) if reward is not None else {},
        reward_status=str(reward.status) if reward is not None else "unscored",
        flags=list(reward.flags) if reward is not None else [],
        outcome=str(reward.outcome if reward is not None else {Termination.TIMEOUT: Outcome.TIMEOUT, Termination.ERROR: Outcome.ERROR,
                                                               Termination.TRUNCATED: Outcome.TRUNCATED}.get(termination, Outcome.FAIL)),
        turns=len(steps), tool_calls=len(calls), tool_failures=sum(c.status in FAILED_CALL for c in calls),
        invalid_actions=sum(s.observation_status == "invalid_action" for s in steps),
        prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
        **_arrays(token_ids, loss_mask, logprobs, segment_starts),
        started_at=steps[0].started_at if steps else utcnow(), ended_at=steps[-1].ended_at if steps else utcnow(),
        role=role, **kwargs)


def _step_reward(given: float | None, obs) -> float:
    """Step i's own reward: the one given, else the number its observation reports as `info["reward"]`, else 0.0."""
    if given is not None:
        return float(given)
    reported = (getattr(obs, "info", None) or {}).get("reward") if obs is not None else None
    if isinstance(reported, (int, float)) and not isinstance(reported, bool) and math.isfinite(reported):
        return float(reported)
    return 0.0
