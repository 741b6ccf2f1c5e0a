"""Turns played by seats: the actor of the one episode loop (`episode_loop.py`) for the policy
alone (`run_episode`) and for the roles of a multi-agent harness (`multi_episode`).

A seat is one side of the episode: the policy, a fixed opponent's inference server, or the
harness's `scripted_move`. A model seat keeps its own conversation under the model's chat template
as token ids, never re-tokenized: its prompt (its system prompt and the harness's `tools()`, as a
single-agent episode offers them), each generation exactly as served (loss mask 1 where the policy
played it, with its log-probs), and what it is shown before its next move (loss mask 0). A move
reaches the harness as one `Action`, built in one place (`Seat.action`): the generated text and the
tool calls the seat's chat renderer parsed from it, whoever played the seat.

Each turn: who moves (`Turns.to_move`), what that seat is shown (`Turns.view`), its move (a
generation resumed across server failures, or the scripted move), the harness's `step`; until done,
`max_steps` (`truncated`), a seat out of context (`truncated`), a deadline (`timeout`) or a failure.

Belongs here: seats, their generations and the order of a turn. Not here: the harness calls and the
phases around the turns (`episode_loop.py`), who moves in a multi-agent game (`multi_episode.py`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from agentrl_cli.core.episode import Action
from agentrl_cli.core.outcomes import Termination
from agentrl_cli.engines.inference.client import SamplingParams
from agentrl_cli.engines.resume import GenerationLost, generate_resumable
from agentrl_cli.model.chat import ChatRenderer, check_episode, strip_stops
from agentrl_cli.runtime.data.schema import utcnow
from agentrl_cli.runtime.observe import traces
from harnesses.multi_agent import POLICY, SCRIPTED

CONTEXT_ROOM = 8  # a model seat with fewer tokens than this left before context_limit stops: truncated


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
    pieces: list[list[dict]] = field(default_factory=list)  # per generation: tokens, weight_version, server of each answer
    prompt_tokens: int = 0
    completion_tokens: int = 0
    last_text: str | None = None  # its last move, waiting for what it is shown next
    last_out: list[int] = field(default_factory=list)
    closed: bool = False  # its last generation was cut by length (the end-of-turn token was appended)

    def open(self, tokenizer, system: str, tools: list[dict], text: str) -> None:
        """Start its conversation: the system prompt, the tools, and `text` as the first user turn."""
        self.chat = ChatRenderer(tokenizer, system, tools)
        ids = self.chat.first_prompt(text)
        self.token_ids, self.loss_mask, self.logprobs = list(ids), [0] * len(ids), [0.0] * len(ids)
        self.prompt_tokens = len(ids)

    def show(self, text: str) -> None:
        """Close its last move and show it `text` (the environment's reply), up to its next move."""
        self.chat.generated(self.last_out, self.last_text, self.closed)
        if self.closed:  # cut by length: close the turn so the template stays valid
            self._add([self.chat.eos], 0)
        self._add(self.chat.reply(self.last_text, text), 0)
        self.last_text = None

    def room(self, context_limit: int) -> int:
        return context_limit - len(self.token_ids) - 1

    def took(self, gen, counters) -> str:
        """Add a generation as served; returns its text."""
        out = list(gen.output_ids)
        self._add(out, 1 if self.seat == POLICY else 0, list(gen.output_logprobs))
        self.completion_tokens += len(out)
        self.pieces.append(list(gen.meta.get("pieces", [])))
        if len({p["weight_version"] for p in self.pieces[-1]}) > 1:
            counters["mixed_version_generations"] += 1
        text = self.chat.tok.decode(strip_stops(out, self.chat.format), skip_special_tokens=False)
        self.closed = not out or out[-1] not in self.chat.stop_ids  # cut by length
        self.last_text, self.last_out = text, out
        return text

    def action(self, text: str) -> Action:
        """The move as the harness receives it: the text and the tool calls its chat renderer parses
        (none for a scripted seat, as the contract's scripted play sends them)."""
        return Action(text=text, tool_calls=self.chat.tool_calls(text) if self.chat is not None else [])

    def close(self, counters) -> None:
        """Close the conversation on its last move and count the token-exact check
        (`model.chat.check_episode`): `token_exact_episodes` checked, `token_exact_mismatches` (the
        template does not reproduce the episode), `token_exact_retokenized` (generated tokens the
        tokenizer would split differently; kept as sampled)."""
        if self.chat is None:
            return
        if self.last_text is not None:
            self.chat.generated(self.last_out, self.last_text, closed=False)
            self.chat.finish(self.last_text)
            self.last_text = None
        try:
            found = check_episode(self.token_ids, self.chat)
        except Exception:  # noqa: BLE001 - a template that cannot render its own conversation is counted, not fatal
            counters["token_exact_render_errors"] += 1
            return
        counters["token_exact_episodes"] += 1
        counters["token_exact_mismatches"] += found.mismatches
        counters["token_exact_retokenized"] += found.retokenized

    def _add(self, ids: list[int], mask: int, logprobs: list[float] | None = None) -> None:
        self.token_ids += ids
        self.loss_mask += [mask] * len(ids)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)


async def generate(ep, seat: Seat, step: int, label: str = "") -> tuple[str, str] | None:
    """`seat`'s move at joint step `step`: its text and the weight version it came from, or None
    when the generation was lost (the episode ended `infra_error`, `label` before the error)."""
    s, result = ep.settings, ep.result
    sampling = SamplingParams(max_new_tokens=min(s.max_new_tokens, seat.room(s.context_limit)), temperature=s.temperature,
                              seed=None if s.seed is None else s.seed * 1000 + step, stop_token_ids=seat.chat.stop_ids)
    t = time.perf_counter()
    try:
        gen = await traces.child("model_call", generate_resumable(
            seat.client, seat.token_ids, sampling, s.resume, result.counters,
            on_recovered=s.on_recovered if seat.seat == POLICY else None), {"step": step}, traces.model_call_attributes)
    except GenerationLost as exc:
        result.generate_s += time.perf_counter() - t
        result.termination, result.error = Termination.INFRA_ERROR, f"{label}{exc.message}"
        return None
    result.generate_s += time.perf_counter() - t
    if s.stats is not None:
        s.stats.record_generation(ep.name, time.perf_counter() - t)
    if s.watchdog is not None:
        s.watchdog.beat("rollout")
    return seat.took(gen, result.counters), gen.weight_version


class Turns:
    """Seats moving in turn (the loop's `Actor`); `to_move`, `view` and `shown` say who moves and
    what it sees, `score` what the harness is asked for afterwards."""

    def __init__(self, seats: dict[str, Seat], tokenizer) -> None:
        self.seats, self.tokenizer = seats, tokenizer
        self.step_roles: list[str] = []

    async def to_move(self, ep) -> tuple[bool, str | None]:
        """(True, the role that moves now; None when the episode is over), or (False, None) when it ended."""
        raise NotImplementedError

    async def view(self, ep, seat: Seat) -> bool:
        """Put what `seat` is shown now into its conversation; False when the episode ended."""
        return True

    def shown(self, seat: Seat, obs) -> None:
        """After a step that did not end the episode: what the mover is shown of its result at once."""

    def label(self, role: str) -> str:
        return ""

    async def act(self, ep, first) -> bool:
        """Turns until done, `max_steps`, a seat out of context or a failure; False when a generation
        was lost (nothing to score)."""
        for step in range(ep.settings.max_steps):
            ok, role = await self.to_move(ep)
            if not ok:
                break
            if role is None:
                ep.result.termination = Termination.DONE
                break
            seat = self.seats[role]
            started = utcnow()
            if seat.seat == SCRIPTED:
                ok, text = await ep.attempt("scripted_move", role)
                if not ok:
                    break
                text, version = text or "", ""
            else:
                if not await self.view(ep, seat) or seat.room(ep.settings.context_limit) < CONTEXT_ROOM:
                    break  # ended, or out of context: truncated
                moved = await generate(ep, seat, step, self.label(role))
                if moved is None:
                    return False  # lost: not scored, not the agent's doing, no evidence to collect
                text, version = moved
            for other in self.seats.values():
                other.weight_versions.append(version if other is seat else "")
            action = seat.action(text)
            self.step_roles.append(role)
            ok, obs = await traces.child("tool_call", ep.step(action), traces.tool_call_attributes(step, action),
                                         lambda out: traces.observation_attributes(out[1]))
            ep.result.step_times.append((started, utcnow()))
            if not ok:
                break
            if obs.done:
                ep.result.termination = Termination.DONE
                break
            self.shown(seat, obs)
        return True

    def close(self, ep) -> None:
        for seat in self.seats.values():
            seat.close(ep.result.counters)

    async def score(self, ep) -> None:
        raise NotImplementedError
