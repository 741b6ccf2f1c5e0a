"""The episode vocabulary: the types one episode is told in, from the task a harness is given to
the tool calls it made. Harnesses, the rollout, the reward request and the stored record all speak
it; it is the ground floor and imports nothing of theirs (`harnesses.base` re-exports it, with the
harness contract around it).

Belongs here: plain typed data of an episode and its tasks, and `calls_of`, the one reading of the
tool calls an observation reports. Not here: parsing model text (`harnesses.parsing`,
`model.chat`), scoring (`runtime/reward/`), the stored row (`data.schema`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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
    """A call the agent asked for: the tool's name and its parsed arguments."""

    name: str
    arguments: dict
    id: str = ""


@dataclass
class ToolCallResult:
    """A call the harness made and how it went: one per call, in order, on `Observation.calls`.

    `status` is one of OBSERVATION_STATUSES, the call's own (a step's status is its worst call's);
    `exit_code` is a command's exit status (None for calls that have none); `output` is what the
    call returned as the agent was shown it."""

    name: str
    arguments: dict = field(default_factory=dict)
    status: str = "ok"
    latency_ms: float = 0.0
    retries: int = 0
    exit_code: int | None = None
    output: str = ""


@dataclass
class Observation:
    text: str
    data: dict | None = None
    image: bytes | None = None
    done: bool = False
    status: str = "ok"  # one of OBSERVATION_STATUSES
    info: dict = field(default_factory=dict)
    calls: list[ToolCallResult] = field(default_factory=list)  # the tool calls of this step, in order

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
    (The stored trajectory record in agentrl_cli.runtime.data carries much more.)"""

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


@dataclass
class HarnessReward:
    """What a harness's `compute_reward` may return instead of a bare float: the score in [0, 1],
    flags the reward service records (`tamper` scores 0 whatever the score says) and a short detail."""

    score: float
    flags: list[str] = field(default_factory=list)
    detail: str = ""

    @classmethod
    def of(cls, value) -> "HarnessReward":
        """A float, a bool or a HarnessReward as a HarnessReward (anything else is a TypeError naming it)."""
        if isinstance(value, HarnessReward):
            return value
        if isinstance(value, (int, float)):
            return cls(float(value))
        raise TypeError(f"compute_reward returned {type(value).__name__}, not a float or HarnessReward")


@dataclass(frozen=True)
class TaskSet:
    """A harness's versioned tasks (train and eval splits). A harness that brings its own tasks
    defines `task_set()` as a classmethod returning one; the version is recorded with every
    trajectory trained or evaluated on them."""

    version: str
    tasks: tuple[TaskSpec, ...]

    def select(self, split: str | None = None, family: str | None = None) -> list[TaskSpec]:
        return [t for t in self.tasks if (split is None or t.split == split)
                and (family is None or t.meta.get("family") == family)]


def calls_of(observation: Observation) -> list[ToolCallResult]:
    """The tool calls an observation reports: `calls`, or else the dicts of `info["calls"]` that
    harnesses written before `calls` existed put there (keys `tool`, `arguments`, `status`,
    `latency_ms` or `duration_s`, `retries`, `exit_code`, `output`; a call without a status has the step's)."""
    if observation.calls:
        return list(observation.calls)
    out = []
    for c in (observation.info or {}).get("calls") or []:
        if not isinstance(c, dict):
            continue
        arguments = c.get("arguments")
        exit_code = c.get("exit_code")
        out.append(ToolCallResult(name=str(c.get("tool", "tool")), arguments=arguments if isinstance(arguments, dict) else {},
                                  status=str(c.get("status") or observation.status),
                                  latency_ms=float(c.get("latency_ms") or 1000.0 * (c.get("duration_s") or 0.0)),
                                  retries=int(c.get("retries") or 0),
                                  exit_code=exit_code if isinstance(exit_code, int) and not isinstance(exit_code, bool) else None,
                                  output=c["output"] if isinstance(c.get("output"), str) else ""))
    return out
