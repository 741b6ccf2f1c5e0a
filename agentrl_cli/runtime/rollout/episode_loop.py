"""The one episode loop: what every episode does whoever acts in it, written once. Reset the harness
(retried `create_retries` times with doubling backoff, then masked `infra_error`), let the actor
play its turns, close the actor's conversations (the token-exact check), collect the evidence while
the episode's state is alive, and let the actor ask the harness for its own reward.

The actor is who moves: the policy (its inference client and chat renderer: `run_episode`), the
roles of a multi-agent harness (`multi_episode`) or an agent that plays itself through the run's
gateway (`agent_episode`). Each is an `Actor`; the seats and their turns are `turns.py`.

Every harness call goes through `Episode.call`: in the executor, under the step deadline, its time
added to `env_s`, watched as "harness NAME" (a call that returns also beats "rollout"). An
exception from harness code ends the episode `infra_error` naming the method (`harness_failed`):
masked, the environment failed, not the agent. An `EnvironmentLost` (the episode's sandbox is gone
with its service replica) ends it `infra_error` too, flagged with its `flag` (`sandbox_lost`) and not
counted against the harness. An `EnvironmentBusy` from reset (the server is at capacity) leaves the
episode to the controller, which waits and plays it again (`controller.py`). A step deadline passed ends it `timeout` (scored);
a reset past it ends it `infra_error` flagged `environment_unavailable` (masked: there is no episode to
score, and no token to train). Either way the call still runs in its thread: the instance is retired.

Belongs here: the result of one episode, its harness calls and the order of its phases. Not here:
generating a move (`turns.py`), the controller's side of an episode (lending the harness, scoring,
storing: `episode_scaffold.py`).
"""

from __future__ import annotations

import asyncio
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

from agentrl_cli.core.errors import EnvironmentBusy, EnvironmentLost
from agentrl_cli.core.episode import HarnessReward, Observation, Trajectory
from agentrl_cli.core.outcomes import Termination
from agentrl_cli.engines.resume import ResumePolicy
from harnesses.defaults import default_evidence


@dataclass
class EpisodeResult:
    trajectory: Trajectory
    evidence: object | None
    termination: str  # done | truncated | timeout | error | infra_error (inference lost: masked)
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    weight_versions: list[str] = field(default_factory=list)  # per step: the oldest version its tokens came from
    pieces: list[list[dict]] = field(default_factory=list)  # per step: tokens, weight_version, server of each answer
    step_times: list[tuple] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    generate_s: float = 0.0
    env_s: float = 0.0
    error: str = ""
    counters: Counter = field(default_factory=Counter)  # resume.COUNTERS, token_exact_*
    harness_error: tuple[str, str] | None = None  # (method, what it raised) when the harness's own code failed
    harness_reward: HarnessReward | None = None  # its compute_reward, when harnesses[].reward asks for it
    segment_starts: list[int] = field(default_factory=list)  # several training samples: where each starts ([] = one)
    step_rewards: list[float | None] = field(default_factory=list)  # per step: a reward given to it alone (None: none)
    infra_flag: str = ""  # infra_error: the flag that says why, when not the controller's own guess


def harness_failed(result, method: str, exc: BaseException):
    """End the episode `infra_error` (masked: the environment failed, not the agent) because the
    harness's `method` raised `exc`; the error names the method, the exception and where it was raised.
    `result`: an `EpisodeResult` or a `multi_episode.MultiEpisodeResult`. An `EnvironmentLost` is no
    harness bug: the episode ends `infra_error` flagged with its `flag`, `harness_error` left None."""
    if isinstance(exc, EnvironmentLost):
        result.termination, result.infra_flag = Termination.INFRA_ERROR, exc.flag
        result.error = f"{method}(): {exc.message}" + (f"; fix: {exc.hint}" if exc.hint else "")
        return result
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}" if frames else ""
    result.termination = Termination.INFRA_ERROR
    result.harness_error = (method, f"{type(exc).__name__}: {exc}{where}")
    result.error = f"harness {method}() raised {result.harness_error[1]}"
    return result


ABANDONED = "env_calls_abandoned"  # result counter: harness calls left running past the step deadline


def env_caller(loop, executor, step_timeout_s: float | None, watchdog, component: str, result):
    """`await env(fn, *args)`: a harness call in `executor` under the step deadline (None: none), its
    time added to `result.env_s`, reported to the watchdog as `component` (a finished call also beats
    "rollout"). A call past the deadline raises TimeoutError and counts in `result.counters[ABANDONED]`:
    its thread cannot be stopped, so the instance is retired rather than lent again (`episode_scaffold.lend`)."""

    async def env(fn, *args):
        t = time.perf_counter()
        ok = False
        if watchdog is not None:
            watchdog.begin(component)
        try:
            out = await asyncio.wait_for(loop.run_in_executor(executor, fn, *args), step_timeout_s)
            ok = True
            return out
        except asyncio.TimeoutError:
            result.counters[ABANDONED] += 1  # its thread still runs the call: the harness is not lent again
            grow = getattr(executor, "abandoned", None)  # harness_threads.HarnessThreads: a thread in its place, now
            if grow is not None:
                grow()
            raise
        finally:
            result.env_s += time.perf_counter() - t
            if watchdog is not None:
                watchdog.end(component, ok)
                if ok:
                    watchdog.beat("rollout")
    return env


@dataclass
class Settings:
    """How one episode is played: its limits, sampling and what it reports to."""

    max_steps: int = 1
    step_timeout_s: float | None = None  # a harness call's deadline; None: none (an agent keeps its own)
    max_new_tokens: int = 256
    temperature: float = 1.0
    seed: int | None = None  # each generation's seed: seed * 1000 + the joint step
    context_limit: int = 2048
    create_retries: int = 0  # rollout.env_create_retries
    create_backoff_s: float = 0.5
    reward_source: str = "verifiers"  # harnesses[].reward: harness or mix asks for compute_reward
    resume: ResumePolicy = field(default_factory=ResumePolicy)
    on_recovered: object = None  # async (): awaited when a lost server answers again (policy seats only)
    watchdog: object = None
    stats: object = None  # observe.harness_stats.HarnessStats


class Actor(Protocol):
    """Who moves in an episode."""

    async def act(self, ep: "Episode", first: Observation) -> bool:
        """Play the turns after `reset` returned `first`. False: the episode is over with nothing to
        score (lost or failed: its termination and error say why)."""

    def close(self, ep: "Episode") -> None:
        """Close the conversations and count the token-exact check (in the executor)."""

    async def score(self, ep: "Episode") -> None:
        """The harness's own reward of the episode (after the evidence), when it is asked for."""


class Episode:
    """One episode's harness calls and its result."""

    def __init__(self, harness, task, executor, settings: Settings, result) -> None:
        self.harness, self.task, self.executor, self.settings, self.result = harness, task, executor, settings, result
        self.name = getattr(harness, "name", task.harness)
        self.loop = asyncio.get_running_loop()
        self.raised: BaseException | None = None  # what the last failed harness call raised
        self.call = env_caller(self.loop, executor, settings.step_timeout_s, settings.watchdog, f"harness {self.name}",
                               result)

    @property
    def trajectory(self) -> Trajectory:
        return self.result.trajectory

    def timed_out(self, what: str) -> None:
        self.result.termination = Termination.TIMEOUT
        self.result.error = f"{what} took longer than {self.settings.step_timeout_s:g} s"

    async def attempt(self, method: str, *args) -> tuple[bool, object]:
        """(True, what the harness's `method` returned), or (False, None) after ending the episode:
        `timeout` past the step deadline, `infra_error` when it raised."""
        t = time.perf_counter()
        try:
            out = await self.call(getattr(self.harness, method), *args)
        except asyncio.TimeoutError:
            self.timed_out(method)
            return False, None
        except Exception as exc:  # noqa: BLE001 - a harness bug ends this episode (masked), never the run
            self.raised = exc
            harness_failed(self.result, method, exc)
            return False, None
        if method == "step" and self.settings.stats is not None:
            self.settings.stats.record_step(self.name, time.perf_counter() - t)
        return True, out

    def guard(self, method: str, fn, *args) -> tuple[bool, object]:
        """(True, `fn(*args)`) for a quick call of harness code on the event loop, or (False, None)
        after ending the episode `infra_error` naming `method` when it raised."""
        try:
            return True, fn(*args)
        except Exception as exc:  # noqa: BLE001 - a harness bug ends this episode (masked), never the run
            harness_failed(self.result, method, exc)
            return False, None

    def prompt_part(self, method: str, default) -> tuple[bool, object]:
        """An optional member of the contract that shapes the prompt (`system_prompt`, `tools`): its
        answer, the default where the harness lacks it (`guard`)."""
        own = getattr(self.harness, method, None)
        return self.guard(method, own) if own is not None else (True, default)

    async def reset(self) -> Observation | None:
        """The first observation, the creation retried; None when the episode ended without one."""
        s, stats = self.settings, self.settings.stats
        for attempt in range(s.create_retries + 1):
            t0 = time.perf_counter()
            try:
                obs = await self.call(self.harness.reset, self.task)
            except asyncio.TimeoutError:  # the environment never came up: masked, as a creation that failed
                if stats is not None:
                    stats.record_create(self.name, time.perf_counter() - t0, "timeout")
                self.result.counters["env_create_failures"] += 1
                self.result.termination, self.result.infra_flag = Termination.INFRA_ERROR, "environment_unavailable"
                self.result.error = f"reset took longer than {s.step_timeout_s:g} s"
                return None
            except EnvironmentBusy:
                raise  # the server is at capacity: the controller waits and plays the episode again
            except Exception as exc:  # noqa: BLE001 - an environment that cannot be created is retried, then masked
                if stats is not None:
                    stats.record_create(self.name, time.perf_counter() - t0, type(exc).__name__)
                self.result.counters["env_create_failures"] += 1
                if attempt < s.create_retries:
                    self.result.counters["env_create_retries"] += 1
                    await asyncio.sleep(s.create_backoff_s * 2 ** attempt)
                    continue
                harness_failed(self.result, "reset", exc)
                what = self.result.harness_error[1] if self.result.harness_error else self.result.error
                self.result.error = f"environment creation failed {attempt + 1} times: {what}"
                return None
            if stats is not None:
                stats.record_create(self.name, time.perf_counter() - t0)
            self.trajectory.observations.append(obs)
            return obs
        return None

    async def step(self, action) -> tuple[bool, Observation]:
        """(True, the harness's answer to `action`); (False, an observation that says what went wrong,
        done) when it passed the deadline or raised, the episode ended `timeout` or `infra_error`."""
        self.trajectory.actions.append(action)
        ok, obs = await self.attempt("step", action)
        if not ok:
            status = "timeout" if self.result.termination == Termination.TIMEOUT else "error"
            text = (self.result.error if status == "timeout" or isinstance(self.raised, EnvironmentLost)
                    else f"harness error: {type(self.raised).__name__}: {self.raised}")
            obs = Observation(text=text, status=status, done=True)
        self.trajectory.observations.append(obs)
        return ok, obs

    async def evidence(self) -> bool:
        """The harness's evidence (the default where it defines none); False when collecting it raised."""
        if not hasattr(self.harness, "evidence"):
            self.result.evidence = default_evidence(self.trajectory)
            return True
        try:
            self.result.evidence = await self.call(self.harness.evidence, self.trajectory)
        except asyncio.TimeoutError:
            self.result.error = "collecting evidence timed out"
        except Exception as exc:  # noqa: BLE001 - a harness bug ends this episode (masked), never the run
            harness_failed(self.result, "evidence", exc)
            return False
        return True

    async def harness_reward(self, method: str, read):
        """`read(what the harness's own scoring method returns)`, or None after ending the episode
        `infra_error` (the method or `read` raised, or it passed the step deadline)."""
        try:
            return read(await self.call(getattr(self.harness, method), self.trajectory))
        except asyncio.TimeoutError:
            harness_failed(self.result, method, TimeoutError(f"took longer than {self.settings.step_timeout_s:g} s"))
        except Exception as exc:  # noqa: BLE001 - a harness bug ends this episode (masked), never the run
            harness_failed(self.result, method, exc)
        return None


async def play_episode(harness, task, actor: Actor, executor, settings: Settings, result):
    """One episode of `harness` on `task` played by `actor` into `result`; see the module docstring."""
    ep = Episode(harness, task, executor, settings, result)
    first = await ep.reset()
    if first is None:
        return result
    if not await actor.act(ep, first):
        return result
    # in the harness's thread, so the event loop keeps submitting the other episodes' generations
    # meanwhile (the tokenizer is only read, never configured)
    await ep.loop.run_in_executor(executor, actor.close, ep)
    if result.harness_error is not None or not await ep.evidence():
        return result
    await actor.score(ep)
    return result
