"""Checks every harness must pass, shared by the contract test suite and the stage-5 checks:
scripted play, clean reset (initial observation equal after destroy-and-rebuild, nothing left of
the earlier episode), and invalid actions answered with `invalid_action`, never a crash. They use
only the contract (`harnesses.base`) and the harness's own optional hooks, so they apply to any
harness."""

from __future__ import annotations

from harnesses.base import Action, HarnessReward, Observation, TaskSpec, Trajectory
from harnesses.oracle import oracle_action

INVALID_TEXTS = ("", "hello", "<tool_call>{oops</tool_call>", '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>',
                 '<tool_call>{"name": "run_shell", "arguments": {"cmd": 1}}</tool_call>',
                 '<tool_call>{"name": "calculator", "arguments": {"expression": "__import__(1)"}}</tool_call>')


def play(harness, task: TaskSpec, policy=oracle_action, max_turns: int = 20) -> tuple[Trajectory, Observation]:
    """Run one episode with `policy(task, turn) -> text | None`; returns the trajectory and the last observation."""
    traj = Trajectory(task=task)
    obs = harness.reset(task)
    traj.observations.append(obs)
    for turn in range(max_turns):
        text = policy(task, turn)
        if text is None:
            break
        action = Action(text=text)
        obs = harness.step(action)
        traj.actions.append(action)
        traj.observations.append(obs)
        if obs.done:
            break
    return traj, obs


def scripted_policy(harness):
    """The harness's scripted solutions as a policy (`scripted_action(task, turn)`), or None."""
    harness = getattr(harness, "inner", harness)  # a WithDefaults: the harness's own class
    return getattr(harness if isinstance(harness, type) else type(harness), "scripted_action", None)


def some_actions(task: TaskSpec, turn: int) -> str | None:
    """A policy for harnesses without scripted solutions: two plain actions, then stop."""
    return ("I will look around first.", "ANSWER: 0")[turn] if turn < 2 else None


def reset_clean(harness, task: TaskSpec) -> tuple[bool, str]:
    """Initial observation equal after an episode and a destroy-and-rebuild, and no earlier answer
    counts. The episode is the scripted solution where the harness has one, else `some_actions`."""
    first = harness.reset(task)
    play(harness, task, policy=scripted_policy(harness) or some_actions)
    harness.full_reset()
    again = harness.reset(task)
    same = (again.text, again.data, again.status, again.done) == (first.text, first.data, first.status, first.done)
    if not same:
        return False, f"initial observation changed after rebuild: {first.text[:80]!r} -> {again.text[:80]!r}"
    scores = getattr(harness, "has_reward", lambda: hasattr(harness, "compute_reward"))()
    if scores and HarnessReward.of(harness.compute_reward(Trajectory(task=task))).score != 0.0:
        return False, "state of the earlier episode survived the reset (an empty episode was rewarded)"
    return True, "initial observations equal; no state survived"


def invalid_actions_handled(harness, task: TaskSpec) -> tuple[bool, str]:
    harness.reset(task)
    for text in INVALID_TEXTS:
        try:
            obs = harness.step(Action(text=text))
        except Exception as exc:  # noqa: BLE001 - this is what the check looks for
            return False, f"step({text!r}) raised {type(exc).__name__}: {exc}"
        if obs.status not in ("invalid_action", "error") or obs.done:
            return False, f"step({text!r}) gave status {obs.status!r}, done={obs.done}"
    return True, f"{len(INVALID_TEXTS)} malformed actions answered with invalid_action"
