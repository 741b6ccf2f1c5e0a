"""Build a scoring request from a finished episode: the harness's trajectory, the evidence it
collected and how the episode ended. The rollout calls this right after an episode, before the
harness resets (the evidence holds what the sandbox contained)."""

from __future__ import annotations

import base64

from agentrl_cli.reward.models import FileIn, ScoreRequest, StepIn, TaskIn, ToolCallIn
from harnesses.base import Evidence, Trajectory


def step_tool_calls(observation) -> list[ToolCallIn]:
    """Per-call statuses a harness reported in `info["calls"]` (a call's own status, else the step's)."""
    calls = (observation.info or {}).get("calls") or []
    return [ToolCallIn(name=str(c.get("tool", "tool")), status=str(c.get("status", observation.status)))
            for c in calls if isinstance(c, dict)]


def request_from_episode(traj: Trajectory, evidence: Evidence | None, *, trajectory_id: str,
                         termination: str = "done") -> ScoreRequest:
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
                        final_answer=evidence.final_answer, files=files, protected=dict(evidence.protected))
