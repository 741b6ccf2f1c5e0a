"""Any agentrl harness served as an OpenEnv environment (`agentrl serve env NAME`), so OpenEnv
clients (the package's EnvClient, TRL, SkyRL, ...) can train on it: an openenv `Environment`
subclass wrapping one harness instance per session, served by the package's own server factory
(`create_fastapi_app`: WebSocket `/ws` sessions, `/schema`, `/health`, the task routes).

Protocol (what a client sees):
- reset(task_id=?, index=?, split="train", seed=?): the task with that id, else the `index`-th of
  the split, else task `seed mod N` of the split, else a random one. The observation carries the
  harness's `text`, the `task_id`, and the `system_prompt` and `tools` a chat template needs.
- step(`{"text": "...", "tool_calls": [{"name": ..., "arguments": {...}}]?}`): one model turn,
  the harness parses `text` in its own convention when `tool_calls` is empty. The observation
  carries `text`, `status` (agentrl's: ok, invalid_action, ...) and `calls`.
- reward: 0 before the end; when the harness says done, or after `max_steps` turns (scored as
  truncated), the reward is the one training gives the episode: the evidence and (with
  `harnesses[].reward` harness or mix) the harness's compute_reward go to agentrl's reward
  `Scorer`, and its reward (outcome plus the weighted format and tool-legality components) is the
  step's reward; `metadata` holds the outcome, status and components. Training's truncation
  penalty (`rollout.truncation`) is not applied.
- Tasks are listed without their answers (`/{env}/tasks`, the package's TaskProvider routes).

Belongs here: the wrapping and the app. Not here: the command (`agentrl_cli/cli/commands/serve.py`).
"""

from __future__ import annotations

import functools
import random
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State
from pydantic import BaseModel, Field

from agentrl_cli.core.episode import Action as TurnAction
from agentrl_cli.core.episode import HarnessReward, TaskSet, TaskSpec, ToolCall, Trajectory, calls_of


class CallIn(BaseModel):
    name: str = Field(..., description="the tool's name")
    arguments: dict = Field(default_factory=dict, description="its arguments")


class HarnessAction(Action):
    text: str = Field("", description="the model's turn as it wrote it (tool calls and answers in the harness's convention)")
    tool_calls: list[CallIn] = Field(default_factory=list, description="calls already parsed from the turn (else the harness parses text)")


class HarnessObservation(Observation):
    text: str = Field("", description="what the harness answered")
    status: str = Field("ok", description="ok, empty, error, timeout, rate_limited or invalid_action")
    task_id: str = Field("", description="the episode's task")
    system_prompt: str = Field("", description="the harness's system prompt (on reset)")
    tools: list[dict] = Field(default_factory=list, description="JSON-schema tool specs (on reset)")
    calls: list[dict] = Field(default_factory=list, description="the tool calls this step made and how each went")


@dataclass
class ServedHarness:
    """What every session of one server shares: the harness's name, config, tasks and scorer."""

    name: str
    config: Any  # agentrl_cli.config.models.PlatformConfig
    harness_config: Any  # its harnesses[] entry
    tasks: TaskSet
    scorer: Any  # agentrl_cli.runtime.reward.scorer.Scorer
    reward_source: str
    max_steps: int
    version: str = ""
    rng: random.Random = field(default_factory=random.Random)

    @property
    def env_name(self) -> str:
        """The name in the package's task routes (`/{env_name}/tasks`)."""
        return "".join(c if c.isalnum() or c in "-_" else "_" for c in self.name)

    def pick(self, task_id: str | None, index: int | None, split: str, seed: int | None) -> TaskSpec:
        if task_id is not None:
            found = next((t for t in self.tasks.tasks if t.task_id == task_id), None)
            if found is None:
                raise ValueError(f"unknown task_id {task_id!r} (tasks {self.tasks.version}; list them at /{self.env_name}/tasks)")
            return found
        tasks = self.tasks.select(split)
        if not tasks:
            raise ValueError(f"harness {self.name!r} has no {split!r} tasks; splits: train, eval")
        if index is not None:
            if not 0 <= index < len(tasks):
                raise IndexError(f"index {index} outside the {len(tasks)} {split!r} tasks")
            return tasks[index]
        return tasks[seed % len(tasks)] if seed is not None else self.rng.choice(tasks)

    def close(self) -> None:
        self.scorer.close()


class HarnessEnvironment(Environment[HarnessAction, HarnessObservation, State]):
    """One session: one harness instance (built at the first reset), one episode at a time."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # each session has its own harness instance

    def __init__(self, served: ServedHarness) -> None:
        super().__init__()
        self.served = served
        self.harness = None
        self.traj: Trajectory | None = None
        self.open = False
        self._state = State()

    # -- the package's TaskProvider routes ---------------------------------------------------------
    def list_splits(self) -> list[str]:
        return [s for s in ("train", "eval") if self.served.tasks.select(s)]

    def list_tasks(self, split: str) -> list[dict]:
        return [_public(t, i) for i, t in enumerate(self.served.tasks.select(split))]

    def num_tasks(self, split: str) -> int:
        return len(self.served.tasks.select(split))

    def get_task(self, split: str, index: int) -> dict:
        tasks = self.served.tasks.select(split)
        if not 0 <= index < len(tasks):
            raise IndexError(f"index {index} outside the {len(tasks)} {split!r} tasks")
        return _public(tasks[index], index)

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(name=self.served.name, version=self.served.version,
                                   description=f"agentrl harness {self.served.name} served over OpenEnv (tasks {self.served.tasks.version})")

    # -- the environment ---------------------------------------------------------------------------
    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, task_id: Optional[str] = None,
              index: Optional[int] = None, split: str = "train", **kwargs: Any) -> HarnessObservation:
        task = self.served.pick(task_id, index, split, seed)
        if self.harness is None:
            from harnesses.defaults import WithDefaults
            from harnesses.registry import create

            self.harness = WithDefaults(lambda: create(self.served.name, self.served.config))
        self.open = False
        obs = self.harness.reset(task)
        self.traj = Trajectory(task=task, observations=[obs])
        self.open = True
        self._state = State(episode_id=episode_id or uuid.uuid4().hex, step_count=0, task_id=task.task_id)
        return HarnessObservation(text=obs.text, status=obs.status, task_id=task.task_id, done=False, reward=None,
                                  system_prompt=self.harness.system_prompt(), tools=self.harness.tools())

    def step(self, action: HarnessAction, timeout_s: Optional[float] = None, **kwargs: Any) -> HarnessObservation:
        if not self.open or self.traj is None:
            return HarnessObservation(text="no episode is running: reset first", status="invalid_action", done=True)
        turn = TurnAction(text=action.text, tool_calls=[ToolCall(name=c.name, arguments=dict(c.arguments)) for c in action.tool_calls])
        try:
            obs = self.harness.step(turn)
        except BaseException:
            self.open = False  # the episode's state is unknown: the client sees the error and resets
            raise
        self.traj.actions.append(turn)
        self.traj.observations.append(obs)
        self._state.step_count += 1
        calls = [{"name": c.name, "arguments": c.arguments, "status": c.status, "exit_code": c.exit_code} for c in calls_of(obs)]
        done = obs.done or len(self.traj.actions) >= self.served.max_steps
        reward, metadata = (self._score("done" if obs.done else "truncated") if done else (0.0, {}))
        return HarnessObservation(text=obs.text, status=obs.status, task_id=self.traj.task.task_id, calls=calls,
                                  done=done, reward=reward, metadata=metadata)

    def _score(self, termination: str) -> tuple[float, dict]:
        """Training's reward for the finished episode (see the module docstring); ends the episode."""
        from agentrl_cli.runtime.reward.request_from_episode import request_from_episode

        self.open = False
        try:
            evidence = self.harness.evidence(self.traj)
            own = (HarnessReward.of(self.harness.compute_reward(self.traj))
                   if self.served.reward_source != "verifiers" else None)
        finally:
            self.harness.end_episode()
        req = request_from_episode(self.traj, evidence, trajectory_id=self._state.episode_id or uuid.uuid4().hex,
                                   termination=termination, reward_source=self.served.reward_source, harness_reward=own)
        result = self.served.scorer.score(req)
        return float(result.reward), {"outcome": result.outcome, "reward_status": result.status, "termination": termination,
                                      "components": dict(result.components), "verifier": result.verifier,
                                      "flags": list(result.flags), "detail": result.detail[:500]}

    @property
    def state(self) -> State:
        return self._state

    def close(self) -> None:
        if self.harness is not None:
            self.harness.close()
            self.harness = None


def _public(task: TaskSpec, index: int) -> dict:
    """A task as clients may see it: never its answer or verification data."""
    return {"task_id": task.task_id, "index": index, "split": task.split, "prompt": task.prompt,
            "difficulty": task.difficulty, "family": task.meta.get("family", "")}


def served_harness(name: str, config) -> ServedHarness:
    """The shared part of a server for harness `name` under `config` (ConfigError/NotFoundError, exit 2)."""
    from agentrl_cli.config.models import HarnessConfig
    from agentrl_cli.runtime.reward.scorer import Scorer
    from harnesses.registry import resolve, reward_source
    from harnesses.task_sources import task_set

    cls = resolve(name)
    hc = next((h for h in config.harnesses if h.name == name), None) or HarnessConfig(name=name)
    source = reward_source(hc)
    tasks = task_set(hc, config.data)
    return ServedHarness(name=name, config=config, harness_config=hc, tasks=tasks, scorer=Scorer.from_config(config),
                         reward_source=source, max_steps=config.rollout.max_steps_per_trajectory,
                         version=str(getattr(cls, "version", "")))


def create_env_app(served: ServedHarness, *, max_sessions: int = 8):
    """The package's FastAPI app serving `served` (one harness instance per WebSocket session)."""
    from openenv.core.env_server.http_server import create_fastapi_app

    return create_fastapi_app(functools.partial(HarnessEnvironment, served), HarnessAction, HarnessObservation,
                              max_concurrent_envs=max_sessions, env_name=served.env_name, mode="simulation")
