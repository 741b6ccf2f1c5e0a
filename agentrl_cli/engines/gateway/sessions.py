"""Gateway sessions: one per agent episode, each with its own bearer key and recorder.

A session is created with a random id and a random key (`secrets`, 32 bytes); the agent uses the
key as its OpenAI API key and `{gateway}/s/{id}/v1` as its base URL. A call with no key, a wrong key
or another session's key is refused with 401; keys are compared in constant time (`hmac`), and an
unknown session id costs the same comparison, so answers do not tell which ids exist. A session
idle (no call in flight, none begun) for longer than the time-to-live expires: it is dropped at the
next request the store sees (no background thread) and handed to `on_expire`.

Not here: admission under the run's limit, the chat path (`service.py`), what a session records
(`record.py`), HTTP (`app.py`).
"""

from __future__ import annotations

import hmac
import secrets
import time
from dataclasses import dataclass, field
from typing import Callable

from agentrl_cli.engines.gateway.record import Recorder
from agentrl_cli.engines.openai_api import OpenAIError
from agentrl_cli.engines.openai_api.responses_store import ResponseStore

KEY_PREFIX = "agk-"  # so a leaked key is recognisable (and a grep for it finds it)


@dataclass
class Session:
    id: str
    key: str
    created: float
    last_seen: float
    meta: dict = field(default_factory=dict)
    recorder: Recorder = field(default_factory=Recorder)
    in_flight: int = 0  # calls being served
    responses: ResponseStore = field(default_factory=lambda: ResponseStore(256))  # its Responses API responses


def base_url(root: str, session_id: str) -> str:
    """The OpenAI base URL of a session on a gateway reached at `root` (what an agent's SDK is given)."""
    return f"{root.rstrip('/')}/s/{session_id}/v1"


def bearer(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header (None when absent or another scheme)."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


class SessionStore:
    """The open sessions. `clock` (monotonic seconds) is injectable so expiry is testable without waiting."""

    def __init__(self, ttl_s: float = 600.0, *, clock: Callable[[], float] = time.monotonic,
                 on_expire: Callable[[Session], None] | None = None) -> None:
        if ttl_s <= 0:
            raise ValueError(f"session ttl_s must be positive, got {ttl_s}; give the seconds an idle session lives")
        self.ttl_s, self.clock, self.on_expire = ttl_s, clock, on_expire
        self._sessions: dict[str, Session] = {}
        self._dummy = KEY_PREFIX + secrets.token_urlsafe(32)  # compared against for unknown ids
        self.expired = 0

    def __len__(self) -> int:
        return len(self._sessions)

    def ids(self) -> list[str]:
        return list(self._sessions)

    def create(self, meta: dict | None = None) -> Session:
        self.sweep()
        now = self.clock()
        session = Session(id="s-" + secrets.token_hex(12), key=KEY_PREFIX + secrets.token_urlsafe(32),
                          created=now, last_seen=now, meta=dict(meta or {}))
        self._sessions[session.id] = session
        return session

    def get(self, session_id: str) -> Session | None:
        self.sweep()
        return self._sessions.get(session_id)

    def authorize(self, session_id: str, authorization: str | None) -> Session:
        """The session `authorization` (the Authorization header) opens; OpenAIError 401 otherwise."""
        self.sweep()
        token = bearer(authorization)
        session = self._sessions.get(session_id)
        expected = session.key if session is not None else self._dummy
        matches = hmac.compare_digest((token or "").encode(), expected.encode())
        if token is None:
            raise OpenAIError("no API key: send the session's key as a bearer token (the openai SDK's api_key, or "
                              "OPENAI_API_KEY) from the POST /sessions answer", status=401, code="invalid_api_key")
        if session is None or not matches:
            raise OpenAIError(f"the API key does not open session {session_id!r} (a wrong key, another session's key, or "
                              "a session that was closed or expired after idling); create a session with POST /sessions "
                              "and use its base_url and api_key", status=401, code="invalid_api_key")
        session.last_seen = self.clock()
        return session

    def close(self, session_id: str) -> Session | None:
        return self._sessions.pop(session_id, None)

    def sweep(self) -> list[Session]:
        """Drop the sessions idle past the time-to-live (none with a call in flight); they go to `on_expire`."""
        now = self.clock()
        gone = [s for s in self._sessions.values() if s.in_flight == 0 and now - s.last_seen > self.ttl_s]
        for s in gone:
            del self._sessions[s.id]
            self.expired += 1
            if self.on_expire is not None:
                self.on_expire(s)
        return gone
