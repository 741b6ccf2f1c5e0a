"""One episode of a multi-agent harness (`harnesses.multi_agent`), asynchronously: reset, then
while the harness names a role `to_move`, show that role its own observation (`observe(role)`),
get its move from its seat (the policy's inference server, a fixed opponent's server, or the
harness's `scripted_move`), and `step` it; until done, the step limit (`truncated`) or a deadline.

Each model-played role has its own conversation under the model's chat template (its system
prompt `role_prompt(role)`), kept as token ids as `run_episode` keeps one: its prompt, each of its
generations exactly as served (loss mask 1, log-probs), and before each later move what it is shown
then (loss mask 0). The joint trajectory (every role's moves in order, `step_roles`) is what the
harness saw, what is stored with every role's record and what replay plays again. After the
episode `role_rewards` scores each role while the state is alive.

A generation that cannot be completed ends the episode `infra_error` (masked for every role); an
exception from harness code ends it `infra_error` too, naming the method.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field

from agentrl_cli.runtime.data.schema import utcnow
from agentrl_cli.core.episode import Action, HarnessReward, Observation, Trajectory
from agentrl_cli.engines.inference.client import SamplingParams
from agentrl_cli.model.chat import ChatRenderer, check_episode, strip_stops
from agentrl_cli.core.outcomes import Termination
from agentrl_cli.engines.resume import GenerationLost, ResumePolicy, generate_resumable
from agentrl_cli.runtime.rollout.run_episode import EpisodeResult, env_caller, harness_failed
from harnesses.defaults import default_evidence
from harnesses.multi_agent import POLICY, SCRIPTED, role_prompt


@dataclass
class Seat:
    """One role's side of the episode: who plays it and, for a model, its conversation as token ids."""

    role: str
    seat: str  # policy | scripted | an inference server URL
    client: object = None  # the InferenceClient that plays it (None: scripted)
    chat: ChatRenderer | None = None
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    weight_versions: list[str] = field(default_factory=list)  # per joint step; "" where another role moved
    prompt_tokens: int = 0
    completion_tokens: int = 0
    last_text: str | None = None  # its last move, waiting for what it is shown next
    last_out: list[int] = field(default_factory=list)
    closed: bool = False  # its last generation was cut by length (the end-of-turn token was appended)


@dataclass
class MultiEpisodeResult:
    trajectory: Trajectory  # the joint episode: every role's moves in order
    step_roles: list[str]
    seats: dict[str, Seat]
    termination: str = Termination.TRUNCATED
    role_rewards: dict[str, HarnessReward] = field(default_factory=dict)
    evidence: object | None = None
    step_times: list[tuple] = field(default_factory=list)
    generate_s: float = 0.0
    env_s: float = 0.0
    error: str = ""
    counters: Counter = field(default_factory=Counter)
    harness_error: tuple[str, str] | None = None

    def role_result(self, role: str) -> EpisodeResult:
        """The single-agent view of `role`: the joint trajectory with its own training sequence, as
        the record and the scoring request are built from."""
        s = self.seats[role]
        return EpisodeResult(trajectory=self.trajectory, evidence=self.evidence, termination=self.termination,
                             token_ids=s.token_ids, loss_mask=s.loss_mask, logprobs=s.logprobs,
                             weight_versions=s.weight_versions, step_times=self.step_times, prompt_tokens=s.prompt_tokens,
                             completion_tokens=s.completion_tokens, generate_s=self.generate_s, env_s=self.env_s,
                             error=self.error, counters=Counter(), harness_error=self.harness_error,
                             harness_reward=self.role_rewards.get(role))


async def run_multi_episode(harness, task, seats: dict[str, Seat], tokenizer, executor, *, max_steps: int,
                            step_timeout_s: float, max_new_tokens: int, temperature: float = 1.0, seed: int | None = None,
                            context_limit: int = 2048, resume: ResumePolicy | None = None, on_recovered=None,
                            watchdog=None, stats=None) -> MultiEpisodeResult:
    """Play one episode with `seats` (role -> Seat; a model seat carries its client). `seed`: each
    generation's seed is derived from it and the joint step. `stats` (observe.harness_stats.HarnessStats)
    records the environment's creation and step latencies and each generation's. See the module docstring."""
    loop = asyncio.get_running_loop()
    traj = Trajectory(task=task)
    result = MultiEpisodeResult(trajectory=traj, step_roles=[], seats=seats)
    resume = resume or ResumePolicy()
    name = getattr(harness, "name", task.harness)
    env = env_caller(loop, executor, step_timeout_s, watchdog, f"harness {name}", result)

    async def harness_call(method: str, *args):
        """(True, what a harness method returned), or (False, None) after ending the episode (timeout or infra_error)."""
        t = time.perf_counter()
        error = None
        try:
            out = await env(getattr(harness, method), *args)
            if stats is not None and method == "step":
                stats.record_step(name, time.perf_counter() - t)
            return True, out
        except asyncio.TimeoutError:
            error = "timeout"
            result.termination, result.error = Termination.TIMEOUT, f"{method} took longer than {step_timeout_s:g} s"
        except Exception as exc:  # noqa: BLE001 - a harness bug ends this episode (masked), never the run
            error = type(exc).__name__
            _failed(result, method, exc)
        finally:
            if stats is not None and method == "reset":
                stats.record_create(name, time.perf_counter() - t, error)
        return False, None

    ok, obs = await harness_call("reset", task)
    if not ok:
        return result
    traj.observations.append(obs)
    for step in range(max_steps):
        ok, role = await harness_call("to_move")
        if not ok:
            return result
        if role is None:
            result.termination = Termination.DONE
            break
        seat = seats[role]
        started = utcnow()
        if seat.seat == SCRIPTED:
            ok, text = await harness_call("scripted_move", role)
            if not ok:
                return result
            text, version = text or "", ""
        else:
            ok, view = await harness_call("observe", role)
            if not ok:
                return result
            if not _show(seat, harness, tokenizer, view, context_limit):
                break  # out of context: truncated
            room = context_limit - len(seat.token_ids) - 1
            sampling = SamplingParams(max_new_tokens=min(max_new_tokens, room), temperature=temperature,
                                      seed=None if seed is None else seed * 1000 + step, stop_token_ids=seat.chat.stop_ids)
            t = time.perf_counter()
            try:
                gen = await generate_resumable(seat.client, seat.token_ids, sampling, resume, result.counters,
                                               on_recovered=on_recovered if seat.seat == POLICY else None)
            except GenerationLost as exc:
                result.generate_s += time.perf_counter() - t
                result.termination, result.error = Termination.INFRA_ERROR, f"role {role}: {exc.message}"
                return result
            result.generate_s += time.perf_counter() - t
            if stats is not None:
                stats.record_generation(name, time.perf_counter() - t)
            if watchdog is not None:
                watchdog.beat("rollout")
            out = list(gen.output_ids)
            seat.token_ids += out
            seat.loss_mask += [1 if seat.seat == POLICY else 0] * len(out)
            seat.logprobs += list(gen.output_logprobs)
            seat.completion_tokens += len(out)
            text = tokenizer.decode(strip_stops(out, seat.chat.format), skip_special_tokens=False)
            seat.closed = not out or out[-1] not in seat.chat.stop_ids
            seat.last_text, seat.last_out = text, out
            version = gen.weight_version
        for s in seats.values():
            s.weight_versions.append(version if s is seat else "")
        action = Action(text=text)
        traj.actions.append(action)
        result.step_roles.append(role)
        ok, obs = await harness_call("step", action)
        if not ok:
            traj.observations.append(Observation(text=result.error or "step failed", status="error", done=True))
            result.step_times.append((started, utcnow()))
            break
        traj.observations.append(obs)
        result.step_times.append((started, utcnow()))
        if obs.done:
            result.termination = Termination.DONE
            break
    _finish(result)
    if result.harness_error is not None or result.termination == Termination.TIMEOUT:
        return result
    if hasattr(harness, "evidence"):
        ok, result.evidence = await harness_call("evidence", traj)
        if not ok:
            return result
    else:
        result.evidence = default_evidence(traj)
    ok, scores = await harness_call("role_rewards", traj)
    if ok:
        try:
            result.role_rewards = {str(r): HarnessReward.of(v) for r, v in dict(scores).items()}
        except (TypeError, ValueError) as exc:
            _failed(result, "role_rewards", exc)
        missing = [r for r in seats if r not in result.role_rewards]
        if missing and result.harness_error is None:
            _failed(result, "role_rewards", ValueError(f"no score for role {', '.join(missing)}"))
    return result


def _show(seat: Seat, harness, tokenizer, view: Observation, context_limit: int) -> bool:
    """Put what `seat`'s role is shown now into its conversation: the first prompt, or the reply
    closing its last move. False when its context has no room left for a move."""
    if seat.chat is None:
        seat.chat = ChatRenderer(tokenizer, role_prompt(harness, seat.role), [])
        ids = seat.chat.first_prompt(view.text)
        seat.token_ids, seat.loss_mask, seat.logprobs = list(ids), [0] * len(ids), [0.0] * len(ids)
        seat.prompt_tokens = len(ids)
    else:
        seat.chat.generated(seat.last_out, seat.last_text, seat.closed)
        if seat.closed:  # cut by length: close the turn so the template stays valid
            seat.token_ids.append(seat.chat.eos)
            seat.loss_mask.append(0)
            seat.logprobs.append(0.0)
        reply = seat.chat.reply(seat.last_text, view.text)
        seat.token_ids += reply
        seat.loss_mask += [0] * len(reply)
        seat.logprobs += [0.0] * len(reply)
        seat.last_text = None
    return context_limit - len(seat.token_ids) - 1 >= 8


def _finish(result: MultiEpisodeResult) -> None:
    """Close every model seat's conversation on its last move and count the token-exact check."""
    for seat in result.seats.values():
        if seat.chat is None:
            continue
        if seat.last_text is not None:
            seat.chat.generated(seat.last_out, seat.last_text, closed=False)
            seat.chat.finish(seat.last_text)
        try:
            found = check_episode(seat.token_ids, seat.chat)
        except Exception:  # noqa: BLE001 - a template that cannot render its own conversation is counted, not fatal
            result.counters["token_exact_render_errors"] += 1
            continue
        result.counters["token_exact_episodes"] += 1
        result.counters["token_exact_mismatches"] += found.mismatches
        result.counters["token_exact_retokenized"] += found.retokenized


def _failed(result: MultiEpisodeResult, method: str, exc: BaseException) -> None:
    """End the episode infra_error because the harness's `method` raised (as `run_episode.harness_failed`)."""
    one = EpisodeResult(trajectory=result.trajectory, evidence=None, termination=result.termination)
    harness_failed(one, method, exc)
    result.termination, result.harness_error, result.error = one.termination, one.harness_error, one.error
