"""Build a scoring request from a finished episode: the harness's trajectory (its steps and the
typed tool calls each observation reports, `agentrl_cli.core.episode.calls_of`), the evidence it
collected and how the episode ended. The rollout calls this right after an episode, before the
harness resets (the evidence holds what the sandbox contained)."""

from __future__ import annotations

import base64

from agentrl_cli.core.episode import Evidence, HarnessReward, Observation, Trajectory, calls_of
from agentrl_cli.runtime.reward.models import FileIn, ScoreRequest, StepIn, TaskIn, ToolCallIn


def step_tool_calls(observation: Observation) -> list[ToolCallIn]:
    """The calls of one step with their own statuses."""
    return [ToolCallIn(name=c.name, status=c.status) for c in calls_of(observation)]


def request_from_episode(traj: Trajectory, evidence: Evidence | None, *, trajectory_id: str,
                         termination: str = "done", reward_source: str = "verifiers",
                         harness_reward: HarnessReward | None = None) -> ScoreRequest:
    """`reward_source` (harnesses[].reward) and the harness's own `harness_reward` (its
    compute_reward, run by the rollout while the episode's state was alive) go with the request."""
    t = traj.task
    evidence = evidence or Evidence()
    steps = []
    for i, action in enumerate(traj.actions):
        obs = traj.observations[i + 1] if i + 1 < len(traj.observations) else None
        steps.append(StepIn(action=action.text, observation=obs.text if obs else "", status=obs.status if obs else "error",
                            tool_calls=step_tool_calls(obs) if obs else []))
    files = [FileIn(path=p, content_b64=None if data is None else base64.b64encode(data).decode())
             for p, data in sorted(evidence.files.items())]
    return ScoreRequest(task=TaskIn(task_id=t.task_id, harness=t.harness, prompt=t.prompt, answer=t.answer,
                                    difficulty=t.difficulty, split=t.split, meta=dict(t.meta)),
                        trajectory_id=trajectory_id, steps=steps, termination=termination,
                        final_answer=evidence.final_answer, files=files, protected=dict(evidence.protected),
                        reward_source=reward_source,
                        harness_score=None if harness_reward is None else harness_reward.score,
                        harness_flags=[] if harness_reward is None else [str(f) for f in harness_reward.flags],
                        harness_detail="" if harness_reward is None else str(harness_reward.detail)[:500])
