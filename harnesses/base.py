"""The harness contract: every environment is presented to training through it. Read top to bottom,
it is all a plugin author needs.

A harness is a class, found by name through the `agentrl.harnesses` entry-point group or named by
a `module:Class` path in the config; training code never changes for a new one. It speaks the
episode vocabulary (`agentrl_cli.core.episode`, re-exported here): it is given a `TaskSpec`, answers
`reset` and `step` with an `Observation`, receives each model turn as an `Action` (raw text plus the
tool calls the model's chat renderer parsed from it) and reports the tool calls it made as
`ToolCallResult`s on `Observation.calls`.

Contract version CONTRACT_VERSION. A harness that lacks one of REQUIRED_MEMBERS is refused when it
loads (exit 2, before any server starts), naming each missing member and the version. Every other
member is optional: agentrl applies its default (`harnesses.defaults.WithDefaults`), never the
harness author. A harness written against an earlier version (1: seed 003's members; 2: + evidence,
Observation.calls, the class hooks) keeps working. The version each harness was checked against is
recorded in every run's meta.json. An exception from harness code ends that episode `infra_error`
(masked, its group completes) and is counted per harness and method; `rollout.max_harness_errors`
failures in a row, or `rollout.max_harness_error_rate` of a window of episodes, stop the run (exit 1).

Required (REQUIRED_MEMBERS):
  name, version             the harness's name and its own version (recorded with every trajectory)
  reset(task) -> Observation  start an episode; no state of an earlier one survives (files,
                            processes, caches, cookies)
  step(action) -> Observation  one model turn; a malformed action is answered with status
                            `invalid_action` (never an exception); `done` ends the episode.
                            `action.tool_calls`, when given, are the calls to make; a harness that
                            finds none there parses `action.text` in its own convention
  close()                   free everything (sandboxes, services, threads)

Optional, each with the default agentrl applies when a harness lacks it:
  system_prompt() -> str    default ""
  tools() -> list[dict]     JSON-schema tool specs as chat templates take them; default []
  evidence(trajectory) -> Evidence  what verifiers need, collected before the episode's state is
                            gone; default: the final answer parsed from the last action, no files
  compute_reward(trajectory) -> float | HarnessReward  the harness's own score in [0, 1] (a
                            HarnessReward adds flags, e.g. `tamper`, and a detail). It is the
                            training reward when `harnesses[].reward` is `harness` (or a component
                            of it with `mix`), called right after the episode while its state is
                            alive; default: none, and `reward: harness` is refused at load
  reward_source (class attribute) "verifiers" | "harness"  what `harnesses[].reward` means when the
                            config leaves it unset; default "verifiers"
  reward_sources (class attribute)  the `harnesses[].reward` values the harness can be scored by
                            (e.g. ("harness",) for tasks no verifier can grade); another is refused
                            at load; default all three
  step_rewards (class attribute) bool  whether its episodes carry a reward per step (an
                            observation's `info["reward"]`, a reward posted for one gateway call),
                            stored as each step's reward; `training.advantage: turn` reads them and
                            is refused at load for a harness without (default False)
  full_reset()              rebuild external state too, for the clean-start check; default: close
                            the instance and build a new one
  end_episode()             free the episode's resources now rather than at the next reset
                            (default: nothing until the next reset)
  capacity(want) -> int | None  the sessions its environment holds at once when fewer than `want`
                            (None: at least `want`), reported by stage 5 (default: not reported).
                            A reset the environment refuses at capacity raises
                            `agentrl_cli.core.errors.EnvironmentBusy` (naming the capacity when
                            known) with no session left open: the run waits and plays the episode
                            again (backpressure, never a harness error)
  task_set() or task_set(options) (classmethod) -> TaskSet  the harness's own versioned tasks
                            (`TaskSource`); one that takes an argument is given
                            `harnesses[].options` (the constructor gets them too). Default:
                            `harnesses[].tasks` must name a file
  scripted_action(task, turn) -> str | None (classmethod)  the action text a competent agent sends
                            at `turn` (0-based), None when the episode is over (`ScriptedSolutions`;
                            default: none, and the checks that need scripted play are skipped)
  wrong_action(task) -> str (classmethod)  an action text that ends the episode with a wrong answer
                            (default: none, and the check that it earns nothing is skipped)
  canary_tasks() -> list[TaskSpec] (classmethod)  eval tasks no answer can pass, for the
                            reward-integrity check (`harnesses.canaries`; default: none)
  terse_action, slip_action, SLIP (classmethods, text)  other styles of the scripted solutions, for
                            the built-in model's warm start (`harnesses.oracle`; default: the plain one)

Several agents in one environment (contract 4; `harnesses.multi_agent` says it whole): a harness
that declares `roles` (class attribute, the role names) is one environment whose shared state every
role observes through its own observations. `step(action)` is the move of the role `to_move()`
names, `observe(role)` is that role's view before it moves, `role_rewards(trajectory)` scores
each role. A harness with `roles` that lacks one of MULTI_AGENT_MEMBERS is refused at load, naming it.

`agentrl harness check NAME|module:Class` prints this check, the defaults applied and one episode.

Tool calls: a step fills `Observation.calls` with one `ToolCallResult` per call it made (the tool's
name, its parsed arguments, its own status). A harness written before `calls` existed may instead
put dicts keyed `tool`, `status`, `latency_ms`, `retries` into `Observation.info["calls"]`; they
are read as calls (`agentrl_cli.core.episode.calls_of`).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from agentrl_cli.core.episode import (OBSERVATION_STATUSES, Action, Evidence, HarnessReward, Observation, TaskSet, TaskSpec,
                                 ToolCall, ToolCallResult, Trajectory, calls_of)

__all__ = ["CONTRACT_VERSION", "MULTI_AGENT_MEMBERS", "OPTIONAL_DEFAULTS", "OBSERVATION_STATUSES", "REQUIRED_MEMBERS", "missing_members", "Action", "Evidence", "HarnessAdapter", "HarnessReward", "Observation", "ScriptedSolutions",
           "TaskSet", "TaskSource", "TaskSpec", "ToolCall", "ToolCallResult", "Trajectory", "calls_of"]


CONTRACT_VERSION = "4"  # 1: seed 003's members; 2: + evidence, Observation.calls, hooks; 3: + HarnessReward, task_set(options), reward_source; 4: + roles (multi-agent)
REQUIRED_MEMBERS = ("name", "version", "reset", "step", "close")
MULTI_AGENT_MEMBERS = ("to_move", "observe", "role_rewards")  # required too of a harness that declares `roles`
OPTIONAL_DEFAULTS = {  # member -> the default agentrl applies (harnesses.defaults)
    "system_prompt": '""', "tools": "[]", "evidence": "final answer parsed from the last action, no files",
    "compute_reward": "none: harnesses[].reward harness/mix refused", "full_reset": "close and build a new instance",
    "task_set": "harnesses[].tasks", "end_episode": "nothing until the next reset",
}


def missing_members(cls: type) -> list[str]:
    """The required members `cls` does not define (with `roles`: MULTI_AGENT_MEMBERS too)."""
    missing = [m for m in REQUIRED_MEMBERS if not hasattr(cls, m)]
    if getattr(cls, "roles", None):
        missing += [m for m in MULTI_AGENT_MEMBERS if not hasattr(cls, m)]
    return missing


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
    def full_reset(self) -> None: ...  # rebuild external state too (the clean-start check)


@runtime_checkable
class TaskSource(Protocol):
    """Optional part of the contract: a harness class that ships its own task set."""

    @classmethod
    def task_set(cls) -> TaskSet: ...


@runtime_checkable
class ScriptedSolutions(Protocol):
    """Optional part of the contract: a harness class that knows how its tasks are solved. The
    contract suite, stage 5 and the built-in model's warm start play these."""

    @classmethod
    def scripted_action(cls, task: TaskSpec, turn: int) -> str | None: ...
