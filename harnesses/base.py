"""The harness contract: every environment is presented to training through it.

A new environment implements `HarnessAdapter` and registers under the `agentrl.harnesses`
entry-point group (or is named by `module:Class` in the config); training code never changes.
`reset` must leave no state from an earlier episode; `full_reset` also rebuilds external state and
is what the clean-start check uses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable  # noqa: F401

OBSERVATION_STATUSES = ("ok", "empty", "error", "timeout", "rate_limited", "invalid_action")


@dataclass
class TaskSpec:
    task_id: str
    harness: str
    prompt: str
    answer: Any
    difficulty: int
    split: str  # "train" | "eval"
    meta: dict = field(default_factory=dict)


@dataclass
class ToolCall:
    name: str
    arguments: dict
    id: str = ""


@dataclass
class Observation:
    text: str
    data: dict | None = None
    image: bytes | None = None
    done: bool = False
    status: str = "ok"  # one of OBSERVATION_STATUSES
    info: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in OBSERVATION_STATUSES:
            raise ValueError(f"observation status must be one of {OBSERVATION_STATUSES}, got {self.status!r}")


@dataclass
class Action:
    text: str  # raw model text
    tool_calls: list[ToolCall] = field(default_factory=list)  # parsed calls


@dataclass
class Trajectory:
    """What a harness scores: the task and the actions and observations of one episode.
    (The stored trajectory record in agentrl_cli.data carries much more.)"""

    task: TaskSpec
    actions: list[Action] = field(default_factory=list)
    observations: list[Observation] = field(default_factory=list)


@dataclass
class Evidence:
    """What verifiers need from a finished episode, collected by the harness (`evidence(trajectory)`,
    optional) before its sandbox is gone, so the episode can be scored anywhere (the reward service)."""

    final_answer: str | None = None
    files: dict[str, bytes | None] = field(default_factory=dict)  # path -> content; None = missing
    protected: dict[str, str] = field(default_factory=dict)  # path -> sha256 it must still have (tamper check)


@dataclass(frozen=True)
class TaskSet:
    """A harness's versioned tasks (train and eval splits). A harness that brings its own tasks
    defines `task_set()` as a classmethod returning one (`TaskSource`); the version is recorded with
    every trajectory trained or evaluated on them."""

    version: str
    tasks: tuple[TaskSpec, ...]

    def select(self, split: str | None = None, family: str | None = None) -> list[TaskSpec]:
        return [t for t in self.tasks if (split is None or t.split == split)
                and (family is None or t.meta.get("family") == family)]


@runtime_checkable
class TaskSource(Protocol):
    """Optional part of the contract: a harness class that ships its own task set."""

    @classmethod
    def task_set(cls) -> TaskSet: ...


@runtime_checkable
class HarnessAdapter(Protocol):
    name: str
    version: str  # contract version, recorded with every trajectory and run

    def system_prompt(self) -> str: ...
    def tools(self) -> list[dict]: ...  # JSON-schema tool specs, as chat templates take them
    def reset(self, task_spec: TaskSpec) -> Observation: ...
    def step(self, action: Action) -> Observation: ...
    def compute_reward(self, trajectory: Trajectory) -> float: ...
    def evidence(self, trajectory: Trajectory) -> Evidence: ...  # what verifiers need, collected before the episode's state is gone
    def close(self) -> None: ...
    def full_reset(self) -> None: ...
