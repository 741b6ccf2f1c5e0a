"""One episode, asynchronously: reset the harness, render the conversation with the model's chat
template, ask the inference server for tokens (with log-probs and the weight version), pass the
action (its text and the tool calls the chat renderer parsed from it) to the harness, repeat until
done, the step limit (`truncated`) or a deadline (`timeout`).

The training sequence is kept as token ids, never re-tokenized: the prompt, then each generated
segment exactly as the server returned it (loss mask 1, its log-probs), then the environment's
reply rendered by the chat template (loss mask 0). Harness calls are synchronous and run in the
given executor, so many episodes overlap their environment waits with generation.

A generation the server aborts or loses is resumed from its partial tokens (`resume.py`); one that
cannot be completed ends the episode as `infra_error` — masked from training, not the agent's fault.
"""

from __future__ import annotations

import asyncio
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field

from agentrl_cli.core.outcomes import Termination
from agentrl_cli.runtime.data.schema import utcnow
from agentrl_cli.engines.inference.client import InferenceClient, SamplingParams
from agentrl_cli.model.chat import ChatRenderer, check_episode, strip_stops
from agentrl_cli.engines.resume import GenerationLost, ResumePolicy, generate_resumable
from agentrl_cli.runtime.observe import traces
from harnesses.defaults import default_evidence
from agentrl_cli.core.episode import Action, HarnessReward, Observation, Trajectory


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


def harness_failed(result: EpisodeResult, method: str, exc: BaseException) -> EpisodeResult:
    """End the episode `infra_error` (masked: the environment failed, not the agent) because the
    harness's `method` raised `exc`; the error names the method, the exception and where it was raised."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}" if frames else ""
    result.termination = Termination.INFRA_ERROR
    result.harness_error = (method, f"{type(exc).__name__}: {exc}{where}")
    result.error = f"harness {method}() raised {result.harness_error[1]}"
    return result



def env_caller(loop, executor, step_timeout_s: float, watchdog, component: str, result):
    """`await env(fn, *args)`: a harness call in `executor` under the step deadline, its time added to
    `result.env_s`, reported to the watchdog as `component` (a finished call also beats "rollout")."""

    async def env(fn, *args):
        t = time.perf_counter()
        ok = False
        if watchdog is not None:
            watchdog.begin(component)
        try:
            out = await asyncio.wait_for(loop.run_in_executor(executor, fn, *args), step_timeout_s)
            ok = True
            return out
        finally:
            result.env_s += time.perf_counter() - t
            if watchdog is not None:
                watchdog.end(component, ok)
                if ok:
                    watchdog.beat("rollout")
    return env

async def run_episode(harness, task, client: InferenceClient, tokenizer, executor, *, max_steps: int,
                      step_timeout_s: float, max_new_tokens: int, temperature: float = 1.0, seed: int | None = None,
                      context_limit: int = 2048, resume: ResumePolicy | None = None, on_recovered=None,
                      watchdog=None, stats=None, create_retries: int = 0, create_backoff_s: float = 0.5,
                      reward_source: str = "verifiers") -> EpisodeResult:
    """`on_recovered`: awaited after a lost server answers again, before generating resumes (the
    run re-syncs weights there). `watchdog`: beats "rollout" per generation and per env step and
    tracks the harness as "harness NAME". `stats` (observe.harness_stats.HarnessStats) records the
    environment's creation and step latencies and its creation failures by error. A creation
    (`reset`) that raises is retried `create_retries` times with doubling backoff; when it still
    fails the episode ends `infra_error` (masked: the environment failed, not the agent).
    `reward_source` `harness` or `mix` (harnesses[].reward): the harness's `compute_reward` runs after
    the evidence, while the episode's state is alive, and its result goes with the scoring request."""
    loop = asyncio.get_running_loop()
    traj = Trajectory(task=task)
    result = EpisodeResult(trajectory=traj, evidence=None, termination=Termination.TRUNCATED)
    resume = resume or ResumePolicy()
    env = env_caller(loop, executor, step_timeout_s, watchdog, f"harness {getattr(harness, 'name', task.harness)}", result)

    name = getattr(harness, "name", task.harness)
    for attempt in range(create_retries + 1):
        t0 = time.perf_counter()
        try:
            obs = await env(harness.reset, task)
        except asyncio.TimeoutError:
            if stats is not None:
                stats.record_create(name, time.perf_counter() - t0, "timeout")
            result.termination, result.error = Termination.TIMEOUT, f"reset took longer than {step_timeout_s:g} s"
            return result
        except Exception as exc:  # noqa: BLE001 - an environment that cannot be created is retried, then masked
            if stats is not None:
                stats.record_create(name, time.perf_counter() - t0, type(exc).__name__)
            result.counters["env_create_failures"] += 1
            if attempt < create_retries:
                result.counters["env_create_retries"] += 1
                await asyncio.sleep(create_backoff_s * 2 ** attempt)
                continue
            harness_failed(result, "reset", exc)
            result.error = f"environment creation failed {attempt + 1} times: {result.harness_error[1]}"
            return result
        if stats is not None:
            stats.record_create(name, time.perf_counter() - t0)
        break
    traj.observations.append(obs)
    prompt_parts = {}
    for method, default in (("system_prompt", ""), ("tools", [])):  # optional members of the contract
        try:
            prompt_parts[method] = getattr(harness, method)() if hasattr(harness, method) else default
        except Exception as exc:  # noqa: BLE001 - a harness bug ends this episode (masked), never the run
            return harness_failed(result, method, exc)
    chat = ChatRenderer(tokenizer, prompt_parts["system_prompt"], prompt_parts["tools"])
    ids = chat.first_prompt(obs.text)
    result.token_ids, result.loss_mask, result.logprobs = list(ids), [0] * len(ids), [0.0] * len(ids)
    result.prompt_tokens = len(ids)
    for step in range(max_steps):
        room = context_limit - len(result.token_ids) - 1
        if room < 8:
            break  # out of context: truncated
        started = utcnow()
        t = time.perf_counter()
        sampling = SamplingParams(max_new_tokens=min(max_new_tokens, room), temperature=temperature,
                                  seed=None if seed is None else seed * 1000 + step, stop_token_ids=chat.stop_ids)
        try:
            gen = await traces.child("model_call", generate_resumable(client, result.token_ids, sampling, resume, result.counters,
                                           on_recovered=on_recovered), {"step": step}, traces.model_call_attributes)
        except GenerationLost as exc:
            result.generate_s += time.perf_counter() - t
            result.termination, result.error = Termination.INFRA_ERROR, exc.message
            return result  # not scored, not the agent's doing: no evidence to collect
        result.generate_s += time.perf_counter() - t
        if stats is not None:
            stats.record_generation(name, time.perf_counter() - t)
        if watchdog is not None:
            watchdog.beat("rollout")
        out = list(gen.output_ids)
        result.token_ids += out
        result.loss_mask += [1] * len(out)
        result.logprobs += list(gen.output_logprobs)
        result.completion_tokens += len(out)
        result.weight_versions.append(gen.weight_version)
        result.pieces.append(list(gen.meta.get("pieces", [])))
        if len({p["weight_version"] for p in result.pieces[-1]}) > 1:
            result.counters["mixed_version_generations"] += 1
        text = tokenizer.decode(strip_stops(out, chat.format), skip_special_tokens=False)
        closed = not out or out[-1] not in chat.stop_ids  # cut by length: closed below unless the episode ends here
        action = Action(text=text, tool_calls=chat.tool_calls(text))
        traj.actions.append(action)
        t_step = time.perf_counter()
        try:
            obs = await traces.child("tool_call", env(harness.step, action), traces.tool_call_attributes(step, action),
                                     traces.observation_attributes)
            if stats is not None:
                stats.record_step(name, time.perf_counter() - t_step)
        except asyncio.TimeoutError:
            obs = Observation(text=f"step took longer than {step_timeout_s:g} s", status="timeout", done=True)
            traj.observations.append(obs)
            result.step_times.append((started, utcnow()))
            result.termination = Termination.TIMEOUT
            break
        except Exception as exc:  # noqa: BLE001 - a harness bug ends this episode (masked), never the run
            obs = Observation(text=f"harness error: {type(exc).__name__}: {exc}", status="error", done=True)
            traj.observations.append(obs)
            result.step_times.append((started, utcnow()))
            harness_failed(result, "step", exc)
            break
        traj.observations.append(obs)
        result.step_times.append((started, utcnow()))
        if obs.done:
            result.termination = Termination.DONE
            chat.generated(out, text, closed=False)
            chat.finish(text)
            break
        chat.generated(out, text, closed)
        if closed:  # cut by length: close the turn so the template stays valid
            result.token_ids.append(chat.eos)
            result.loss_mask.append(0)
            result.logprobs.append(0.0)
        reply = chat.reply(text, obs.text)
        result.token_ids += reply
        result.loss_mask += [0] * len(reply)
        result.logprobs += [0.0] * len(reply)
    if len(traj.actions) > sum(m["role"] == "assistant" for m in chat.messages):  # ended by a timeout or error
        chat.generated(out, text, closed=False)
        chat.finish(text)
    # a fresh render of the whole conversation: in the harness's thread, so the event loop keeps
    # submitting the other episodes' generations meanwhile (the tokenizer is only read, never configured)
    await loop.run_in_executor(executor, count_mismatches, result, chat)
    if result.harness_error is not None:
        return result
    if not hasattr(harness, "evidence"):
        result.evidence = default_evidence(traj)
    else:
        try:
            result.evidence = await env(harness.evidence, traj)
        except asyncio.TimeoutError:
            result.error = "collecting evidence timed out"
        except Exception as exc:  # noqa: BLE001 - a harness bug ends this episode (masked), never the run
            return harness_failed(result, "evidence", exc)
    if reward_source != "verifiers":
        try:
            result.harness_reward = HarnessReward.of(await env(harness.compute_reward, traj))
        except asyncio.TimeoutError:
            harness_failed(result, "compute_reward", TimeoutError(f"took longer than {step_timeout_s:g} s"))
        except Exception as exc:  # noqa: BLE001 - a harness bug ends this episode (masked), never the run
            harness_failed(result, "compute_reward", exc)
    return result


def count_mismatches(result: EpisodeResult, chat: ChatRenderer) -> None:
    """The token-exact check (`model.chat.check_episode`) as counters: `token_exact_episodes` checked,
    `token_exact_mismatches` (the template does not reproduce the episode), `token_exact_retokenized`
    (generated tokens the tokenizer would split differently; kept as sampled)."""
    try:
        found = check_episode(result.token_ids, chat)
    except Exception:  # noqa: BLE001 - a template that cannot render its own conversation is counted, not fatal
        result.counters["token_exact_render_errors"] += 1
        return
    result.counters["token_exact_episodes"] += 1
    result.counters["token_exact_mismatches"] += found.mismatches
    result.counters["token_exact_retokenized"] += found.retokenized
