"""A harness with the contract's defaults applied (`harnesses.base`, "Optional"): every optional
member exists on `WithDefaults`, answered by the harness where it defines it and by agentrl's
default where it does not. The checks (stage 5, `agentrl harness check`, the contract suite) and
the rollout see one complete harness, whatever contract version it was written against.

Belongs here: the defaults themselves. Not here: loading a harness (`registry`), playing episodes
(`contract`, `agentrl_cli.runtime.rollout`).
"""

from __future__ import annotations

from typing import Callable

from agentrl_cli.core.episode import Evidence, HarnessReward, Trajectory
from harnesses.multi_agent import episode_reward, is_multi_agent
from harnesses.parsing import parse_answer


def default_evidence(trajectory: Trajectory) -> Evidence:
    """The evidence of a harness that defines no `evidence`: the final answer of its last action, no files."""
    return Evidence(final_answer=parse_answer(trajectory.actions[-1].text) if trajectory.actions else None)


def defaults_applied(cls: type) -> dict[str, bool]:
    """optional member -> whether agentrl's default stands in for it."""
    from harnesses.base import OPTIONAL_DEFAULTS

    return {m: not hasattr(cls, m) for m in OPTIONAL_DEFAULTS}


class WithDefaults:
    """`make()` builds the harness; `full_reset` without the harness's own closes it and builds a new one."""

    def __init__(self, make: Callable[[], object]) -> None:
        self._make = make
        self.inner = make()

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def version(self) -> str:
        return self.inner.version

    def reset(self, task):
        return self.inner.reset(task)

    def step(self, action):
        return self.inner.step(action)

    def close(self) -> None:
        self.inner.close()

    def system_prompt(self) -> str:
        return self.inner.system_prompt() if hasattr(self.inner, "system_prompt") else ""

    def tools(self) -> list[dict]:
        return self.inner.tools() if hasattr(self.inner, "tools") else []

    def evidence(self, trajectory: Trajectory) -> Evidence:
        return self.inner.evidence(trajectory) if hasattr(self.inner, "evidence") else default_evidence(trajectory)

    def has_reward(self) -> bool:
        return hasattr(self.inner, "compute_reward") or is_multi_agent(self.inner)

    def compute_reward(self, trajectory: Trajectory) -> float:
        return self.harness_reward(trajectory).score

    def harness_reward(self, trajectory: Trajectory) -> HarnessReward:
        """The harness's own score with its flags (TypeError when it defines no compute_reward)."""
        if not self.has_reward():
            raise TypeError(f"harness {self.name!r} defines no compute_reward")
        return episode_reward(self.inner, trajectory)

    def full_reset(self) -> None:
        if hasattr(self.inner, "full_reset"):
            self.inner.full_reset()
            return
        self.inner.close()
        self.inner = self._make()

    def end_episode(self) -> None:
        if hasattr(self.inner, "end_episode"):
            self.inner.end_episode()

    def __getattr__(self, item):  # the harness's own extras (scripted_action, sandbox, ...)
        return getattr(self.inner, item)
