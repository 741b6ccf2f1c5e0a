"""From a verdict and the steps to one scalar reward with named components, and the outcome label.

The reward is the weighted sum `sum(reward.weights[name] * components[name])`: a component without a
weight (or with weight 0) is recorded and has no effect, and raising one weight by d raises the
reward by exactly d times that component's value. Components (each in [0, 1], all recorded):
- `outcome`: the verifier's score.
- `format`: share of steps whose action the harness could act on (status not `invalid_action`).
- `tool_legality`: share of tool calls that were legal (status not `invalid_action`); 1 without calls.
- `turns_in_range`: 1 when the turn count is within the task's expected range (`meta.max_turns`,
  default 2 + 2 × difficulty), else 0.
- `invalid_action_ratio`: share of steps with an invalid action (a penalty; give it a negative weight).
- `harness`: with `harnesses[].reward: mix`, the harness's own score (weight `reward.weights.harness`).
- one per `reward.verifiers` entry (`judge`, `reward_model`, a user `module:function`), under that
  entry's name: the extra scorer's score (`registry.py`).

Rules that keep the signal honest: a timed-out or errored episode, a tampered one and an
`infra_error` never score above zero. Normalisation (none, per task group, running window) is a
separate, explicit, recorded step (`RewardNormalizer`).
"""

from __future__ import annotations

import statistics
from collections import deque

from agentrl_cli.core import parts
from agentrl_cli.core.outcomes import Outcome, RewardStatus, Termination
from agentrl_cli.runtime.reward.models import ScoreRequest
from agentrl_cli.runtime.reward.verifiers import Verdict

# the components every result carries (`harness` only with reward: mix): the rows of core/parts.py,
# which the config also reads to refuse weights that name none of them
COMPONENTS = parts.names(parts.REWARD_TERMS)


def expected_max_turns(req: ScoreRequest) -> int:
    value = req.task.meta.get("max_turns")
    return int(value) if isinstance(value, int) and value > 0 else 2 + 2 * max(req.task.difficulty, 1)


def process_components(req: ScoreRequest) -> dict[str, float]:
    steps = req.steps
    turns = len(steps)
    invalid = sum(s.status == "invalid_action" for s in steps)
    calls = [c for s in steps for c in s.tool_calls]
    legal = sum(c.status != "invalid_action" for c in calls)
    return {
        "format": (turns - invalid) / turns if turns else 0.0,
        "tool_legality": legal / len(calls) if calls else 1.0,
        "turns_in_range": float(1 <= turns <= expected_max_turns(req)),
        "invalid_action_ratio": invalid / turns if turns else 0.0,
    }


def outcome_label(score: float, termination: str) -> str:
    if termination == Termination.TIMEOUT:
        return Outcome.TIMEOUT
    if termination == Termination.ERROR:
        return Outcome.ERROR
    if score >= 1.0:
        return Outcome.SUCCESS
    if termination == Termination.TRUNCATED:
        return Outcome.TRUNCATED
    return Outcome.PARTIAL if score > 0.0 else Outcome.FAIL


def combine(verdict: Verdict, req: ScoreRequest, weights: dict[str, float],
            extra: dict[str, float] | None = None) -> tuple[float, dict[str, float], str, str]:
    """(reward, components, status, outcome) for a verdict that was reached; `extra`: the scores of
    the `reward.verifiers` scorers by name, components beside the built-in ones."""
    components = {"outcome": float(verdict.score), **process_components(req)}
    if verdict.harness is not None:
        components["harness"] = float(verdict.harness)
    components.update({name: float(score) for name, score in (extra or {}).items()})
    outcome = outcome_label(verdict.score, req.termination)
    reward = sum(w * components[name] for name, w in weights.items() if name in components)
    if req.termination in (Termination.TIMEOUT, Termination.ERROR) or "tamper" in verdict.flags:
        reward = min(reward, 0.0)
    status = (RewardStatus.TIMEOUT if req.termination == Termination.TIMEOUT else
              RewardStatus.OK if outcome in (Outcome.SUCCESS, Outcome.PARTIAL) and "tamper" not in verdict.flags
              else RewardStatus.FAIL)
    return reward, components, status, outcome


class RewardNormalizer:
    """Explicit normalisation of a batch of rewards: `none`, `group` (z-score within each task
    group) or `window` (z-score against a running window of recent rewards). Masked entries
    (None, e.g. infra_error) pass through as None and never enter the statistics."""

    def __init__(self, mode: str = "none", window_size: int = 256, eps: float = 1e-6) -> None:
        if mode not in ("none", "group", "window"):
            raise ValueError(f"reward normalization must be none, group or window, got {mode!r}")
        self.mode, self.eps = mode, eps
        self.window: deque[float] = deque(maxlen=window_size)

    def describe(self) -> dict:
        return {"mode": self.mode, "window_size": self.window.maxlen, "eps": self.eps}

    def apply(self, rewards: list[float | None], groups: list[str] | None = None) -> list[float | None]:
        if self.mode == "none":
            return list(rewards)
        if self.mode == "window":
            self.window.extend(r for r in rewards if r is not None)
            mean = statistics.fmean(self.window) if self.window else 0.0
            std = statistics.pstdev(self.window) if len(self.window) > 1 else 0.0
            return [None if r is None else (r - mean) / (std + self.eps) for r in rewards]
        groups = groups or ["all"] * len(rewards)
        by_group: dict[str, list[float]] = {}
        for r, g in zip(rewards, groups):
            if r is not None:
                by_group.setdefault(g, []).append(r)
        stats = {g: (statistics.fmean(v), statistics.pstdev(v)) for g, v in by_group.items()}
        return [None if r is None else (r - stats[g][0]) / (stats[g][1] + self.eps) for r, g in zip(rewards, groups)]
