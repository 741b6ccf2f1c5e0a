"""The recording gateway as an object the run (or `agentrl serve gateway`) holds: sessions, admission
under the run's limit, the chat path of one call, rewards, and the records training takes.

Admission: `limit()` is the run's allowance, the number of episodes (sessions) it can have in flight
under its staleness limit, read at every request (None: no limit). A new session is refused while as
many sessions are open; a call is refused while as many calls are being served, so a run that
lowers its allowance (the trainer fell behind) throttles the agents already running. A refusal is a
429 in OpenAI's error shape with `Retry-After` (seconds) and `retry-after-ms`, which the openai SDK
honours by retrying after that long (twice by default, `max_retries`).

The chat path: `openai_api.chat_completion` validates and renders the request and parses the answer;
the session's `CallBackend` picks the ids to generate from (`splice.plan_call`) and the session's
`Recorder` stitches the call in. A streamed call is written as it is generated (`chat_deltas`, which
`chat_stream` writes as chat chunks and the Responses and Messages routes as their own events) and
recorded from exactly the ids streamed once it is complete; one whose client went away mid-stream
is aborted and counted (`aborted_calls`), and nothing of it is recorded. Counters (`stats()`) carry
`gateway/` names; a session opened with a `harness` in its meta (the run's agent episodes) also
counts the tool calls its model wrote that the parser refused under
`gateway/<harness>/malformed_tool_calls` (beside the total, `gateway/malformed_tool_calls`).

Not here: HTTP (`app.py`), keys and expiry (`sessions.py`), stitching (`record.py`).
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from typing import AsyncIterator, Callable

from agentrl_cli.engines.gateway.backend import CallBackend
from agentrl_cli.engines.gateway.record import COUNTERS, SessionRecord
from agentrl_cli.engines.gateway.sessions import Session, SessionStore
from agentrl_cli.engines.gateway.splice import Plan, plan_call
from agentrl_cli.model.chat import chat_format
from agentrl_cli.engines.openai_api import ChatCall, OpenAIError, chat_completion
from agentrl_cli.engines.inference.awaiting import Stream
from agentrl_cli.engines.openai_api.live import Delta, LiveChat, live_chat
from agentrl_cli.engines.openai_api.service import prepare_chat

GATEWAY_COUNTERS = ("sessions", "closed_sessions", "expired_sessions", "refused_sessions", "refused_calls",
                    "failed_calls", "unauthorized", *COUNTERS)


class Backpressure(OpenAIError):
    """429: the run's limit is reached; retry after `retry_after_s`."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message, status=429, type="rate_limit_error", code="rate_limit_exceeded")
        self.retry_after_s = retry_after_s

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(max(1, math.ceil(self.retry_after_s))),
                "retry-after-ms": str(max(1, round(self.retry_after_s * 1000)))}


class Gateway:
    """`backend`: an openai_api.Backend (`backend.ClientBackend` in a run). `limit`: the run's allowance
    (see the module docstring; called under the gateway's lock, so it must be quick and never block).
    `retry_after_s`: what a 429 asks the agent to wait. `on_expire`: given each expired session's
    record. Its methods may be called from any thread (the HTTP app runs in the server's)."""

    def __init__(self, backend, *, limit: Callable[[], int | None] | None = None, ttl_s: float = 600.0,
                 retry_after_s: float = 1.0, clock: Callable[[], float] = time.monotonic,
                 on_expire: Callable[[SessionRecord], None] | None = None) -> None:
        self.backend, self.limit, self.retry_after_s = backend, limit or (lambda: None), retry_after_s
        self.format = chat_format(backend.tokenizer)
        self.counters: Counter = Counter({f"gateway/{k}": 0 for k in GATEWAY_COUNTERS})
        self.calls_in_flight = 0
        self._on_expire = on_expire
        self._lock = threading.RLock()  # the run may open, read and close sessions from its own thread
        self.store = SessionStore(ttl_s, clock=clock, on_expire=self._expired)

    def _expired(self, session: Session) -> None:
        self.counters["gateway/expired_sessions"] += 1
        if self._on_expire is not None:
            self._on_expire(session.recorder.snapshot(session.id, session.meta))

    def _refuse(self, what: str, busy: int, allowed: int) -> Backpressure:
        self.counters[f"gateway/refused_{what}s"] += 1
        return Backpressure(f"the training run allows {allowed} {what}s in flight and {busy} are: retry after "
                            f"{self.retry_after_s:g} s (the openai SDK does so by itself)", self.retry_after_s)

    def open_session(self, meta: dict | None = None) -> Session:
        """A new session, or Backpressure when the run's limit is reached."""
        with self._lock:
            self.store.sweep()
            allowed = self.limit()
            if allowed is not None and len(self.store) >= allowed:
                raise self._refuse("session", len(self.store), allowed)
            self.counters["gateway/sessions"] += 1
            session = self.store.create(meta)
            if harness_of(session) is not None:
                self.counters[malformed_key(harness_of(session))] += 0  # in the rows from the harness's first session
            return session

    def open_sessions(self) -> int:
        with self._lock:
            self.store.sweep()
            return len(self.store)

    def session(self, session_id: str) -> Session:
        """The open session `session_id`; OpenAIError 404 naming it otherwise."""
        with self._lock:
            session = self.store.get(session_id)
        if session is None:
            raise OpenAIError(f"no open session {session_id!r} (closed, expired after idling, or never created); "
                              "GET /health lists how many are open", status=404, type="not_found_error")
        return session

    def authorize(self, session_id: str, authorization: str | None) -> Session:
        try:
            with self._lock:
                return self.store.authorize(session_id, authorization)
        except OpenAIError:
            self.counters["gateway/unauthorized"] += 1
            raise

    def calls_of(self, session_id: str) -> int:
        """How many calls of the session are being served (0 for a session that is gone)."""
        with self._lock:
            session = self.store.get(session_id)
            return session.in_flight if session is not None else 0

    def close_session(self, session_id: str) -> SessionRecord:
        """End a session; its record (OpenAIError 404 when there is no such session)."""
        with self._lock:
            session = self.session(session_id)
            self.store.close(session_id)
            self.counters["gateway/closed_sessions"] += 1
            return session.recorder.snapshot(session.id, session.meta)

    def record(self, session_id: str) -> SessionRecord:
        """The session's record so far."""
        with self._lock:
            session = self.session(session_id)
            return session.recorder.snapshot(session.id, session.meta)

    def post_reward(self, session_id: str, reward, call_id: str | None = None) -> SessionRecord:
        """The episode's reward, or with `call_id` one call's; a later post replaces an earlier one."""
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
            raise OpenAIError(f"reward must be a finite number, got {reward!r}", param="reward")
        with self._lock:
            session = self.session(session_id)
            rewards = session.recorder.rewards
            if call_id is None:
                rewards.episode = float(reward)
            else:
                known = session.recorder.call_ids()
                if call_id not in known:
                    raise OpenAIError(f"call_id {call_id!r} is not a call of session {session_id!r}; its calls are "
                                      f"{sorted(known) or 'none yet'} (the `id` of each chat completion or response)", param="call_id")
                rewards.calls[call_id] = float(reward)
            session.last_seen = self.store.clock()
            return session.recorder.snapshot(session.id, session.meta)

    def _admit(self, session: Session) -> None:
        with self._lock:
            allowed = self.limit()
            if allowed is not None and self.calls_in_flight >= allowed:
                raise self._refuse("call", self.calls_in_flight, allowed)
            session.in_flight += 1
            self.calls_in_flight += 1

    def _release(self, session: Session, failed: bool) -> None:
        with self._lock:
            session.in_flight -= 1
            self.calls_in_flight -= 1
            session.last_seen = self.store.clock()
            self.counters["gateway/failed_calls"] += failed

    def _view(self, session: Session, body: dict) -> tuple[CallBackend, list[Plan]]:
        """The call's view of the backend: it chooses the ids to generate from (`splice.plan_call`)."""
        plans: list[Plan] = []

        def choose(rendered: list[int]) -> list[int]:
            with self._lock:
                plans.append(plan_call(session.recorder.tips(), body, rendered, self.backend.tokenizer,
                                       self.format.end_of_turn, self.format.stop_ids))
            return plans[-1].sent

        return CallBackend(self.backend, choose), plans

    def _record(self, session: Session, view: CallBackend, plans: list[Plan], call: ChatCall) -> None:
        if view.sent is None:  # nothing was generated (no choices asked for): nothing to record
            return
        with self._lock:
            before = Counter(session.recorder.counters)
            session.recorder.record(call, view.sent, view.rendered, plans[-1])
            for key, value in session.recorder.counters.items():
                self.counters[f"gateway/{key}"] += value - before[key]
            harness = harness_of(session)
            if harness is not None:
                self.counters[malformed_key(harness)] += session.recorder.counters["malformed_tool_calls"] - \
                    before["malformed_tool_calls"]
        _served_prompt(call, view.sent)

    async def chat(self, session: Session, body: dict, *, call_id: str | None = None) -> ChatCall:
        """Serve and record one chat call of `session` (authorized already). `call_id`: the id the
        client is served the call under when it is not the chat completion's (a Responses `resp_…`):
        the call is recorded, and rewarded, by it."""
        self._admit(session)
        view, plans = self._view(session, body)
        call = None
        try:
            call = await chat_completion(view, body)
        finally:
            self._release(session, call is None)
        if call_id is not None:
            call.response["id"] = call_id
        self._record(session, view, plans, call)
        return call

    async def chat_stream(self, session: Session, body: dict) -> AsyncIterator[str] | None:
        """A streamed chat call of `session` written as it is generated (`chat_deltas` as chat chunks);
        None when it is not streamed live (then `chat`)."""
        started = await self.chat_deltas(session, body)
        if started is None:
            return None
        live, deltas = started
        return live.chat_events(deltas)

    async def chat_deltas(self, session: Session, body: dict, *,
                          call_id: str | None = None) -> tuple[LiveChat, AsyncIterator[Delta]] | None:
        """A streamed call of `session` submitted to be generated live (`openai_api.live`): the call
        and its `Delta`s, which any dialect writes as its own stream; None when it is not streamed
        live (then `chat`). The call is recorded once complete, from exactly the ids streamed, before
        its last deltas; a client that goes away mid-stream (the deltas closed early) aborts the
        generation and the call is counted `aborted_calls` (the session's episode is masked), never
        recorded half. `call_id` as `chat`'s."""
        self._admit(session)
        view, plans = self._view(session, body)
        try:
            prepared = prepare_chat(view, body)
            live = await live_chat(view, prepared, call_id=call_id)
        except BaseException:
            self._release(session, True)
            raise
        if live is None:
            self._release(session, False)
            return None
        live.prompt_tokens = len(view.sent or ())

        async def on_call(call: ChatCall) -> None:
            self._record(session, view, plans, call)

        def on_abort() -> None:
            with self._lock:
                session.recorder.counters["aborted_calls"] += 1
                self.counters["gateway/aborted_calls"] += 1

        deltas = live.deltas(on_call, on_abort)

        async def released() -> AsyncIterator[Delta]:
            try:
                async for delta in deltas:
                    yield delta
            finally:
                try:
                    await deltas.aclose()
                finally:
                    self._release(session, live.call is None)

        async def never_started() -> None:
            try:
                await deltas.aclose()
            finally:
                self._release(session, True)

        return live, Stream(released(), never_started)

    def stats(self) -> dict:
        with self._lock:
            return {**dict(self.counters), "gateway/open_sessions": len(self.store),
                    "gateway/calls_in_flight": self.calls_in_flight}


def harness_of(session: Session) -> str | None:
    """The harness a session plays for (its meta's `harness`), None when it was not given one."""
    h = (session.meta or {}).get("harness")
    return h if isinstance(h, str) and h else None


def malformed_key(h: str) -> str:
    """The counter of tool calls the model wrote, in sessions of harness `h`, that the parser refused."""
    return f"gateway/{h}/malformed_tool_calls"


def _served_prompt(call: ChatCall, sent: list[int]) -> None:
    """Make the call say what was served: its prompt ids and the response's usage."""
    call.prompt_ids = list(sent)
    usage = call.response.get("usage")
    if isinstance(usage, dict) and "prompt_tokens" in usage:
        usage["total_tokens"] = usage.get("total_tokens", 0) - usage["prompt_tokens"] + len(sent)
        usage["prompt_tokens"] = len(sent)
