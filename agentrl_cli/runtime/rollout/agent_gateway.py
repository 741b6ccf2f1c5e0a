"""The recording gateway as a training run holds it, for its agent harnesses (`harnesses/agent`):
started on 127.0.0.1 (`gateway.port`, 0 = a free port) in a server thread, in front of the run's
inference servers through a client of its own built like the run's (its URLs, API key, retries,
policy; one client per event loop), with the run's admission limit (`limit`: sessions and calls
beyond it get 429 with `Retry-After: gateway.retry_after_s`), idle sessions expiring after
`gateway.session_ttl_s`, and an admin key of its own for the run's session management.

Each call's `max_tokens` is capped at `inference.max_new_tokens` (a model turn of any episode) and
its prompt plus completion at `training.seq_len_limit` (what the trainer can take). `ServedTap`
keeps the ids each generation was sent and answered, so an episode's stored ids are checked against
what was served (`verify`: the token-exact check the stage-5 probe and the counters report).

Belongs here: starting, holding and closing the run's gateway, and the run's own session calls.
Not here: the gateway itself (`agentrl_cli/engines/gateway/`), an episode (`agent_episode.py`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import numpy as np

from agentrl_cli.engines.gateway.backend import ClientBackend
from agentrl_cli.engines.gateway.record import SessionRecord
from agentrl_cli.engines.gateway.service import Backpressure, Gateway
from agentrl_cli.engines.gateway.sessions import base_url
from agentrl_cli.engines.inference.awaiting import Stream
from agentrl_cli.engines.openai_api import OpenAIError
from agentrl_cli.engines.resume import ResumePolicy

log = logging.getLogger(__name__)
TAP_PROMPTS = 8192  # prompts whose served generations are kept until an episode checks them
SETTLE_S = 10.0  # how long closing a session waits for calls its agent left in flight (a stream being aborted)


def _digest(ids) -> bytes:
    return hashlib.blake2b(np.asarray(ids, dtype=np.int32).tobytes(), digest_size=16).digest()


class ServedTap:
    """What each generation was sent and answered (by prompt digest), until an episode checks it."""

    def __init__(self, limit: int = TAP_PROMPTS) -> None:
        self._served: OrderedDict[bytes, list[list[int]]] = OrderedDict()
        self._lock, self.limit = threading.Lock(), limit

    def add(self, input_ids: list[int], outputs: list[list[int]]) -> None:
        key = _digest(input_ids)
        with self._lock:
            self._served.setdefault(key, []).extend(list(o) for o in outputs)
            self._served.move_to_end(key)
            while len(self._served) > self.limit:
                self._served.popitem(last=False)

    def check(self, record: SessionRecord) -> tuple[int, int]:
        """(calls checked, mismatches): each call of each segment must have been served exactly the
        segment's ids before it and answered exactly the ids after it, with loss mask 1 on those."""
        checked = bad = 0
        for seg in record.segments:
            ids, mask = list(seg.token_ids), list(seg.loss_mask)
            for step in seg.calls:
                start, n = step.prompt_tokens, step.completion_tokens
                key, generated = _digest(ids[:start]), ids[start:start + n]
                checked += 1
                with self._lock:  # each served generation vouches for one stored call (episodes of a group share prompts)
                    outputs = self._served.get(key, [])
                    found = generated in outputs
                    if found:
                        outputs.remove(generated)
                        if not outputs:
                            del self._served[key]
                bad += not found or mask[start:start + n] != [1] * n
        return checked, bad


class RunBackend:
    """The run's ClientBackend with each call's budget capped and what it served tapped."""

    def __init__(self, inner: ClientBackend, tap: ServedTap, max_new_tokens: int) -> None:
        self.inner, self.tap, self.max_new_tokens = inner, tap, max_new_tokens
        self.tokenizer, self.client = inner.tokenizer, inner.client

    def model_name(self) -> str:
        return self.inner.model_name()

    async def aclose(self) -> None:
        await self.inner.aclose()

    @property
    def streams(self) -> bool:
        return self.inner.streams

    def _capped(self, sampling: dict) -> dict:
        asked = sampling.get("max_new_tokens")
        return {**sampling, "max_new_tokens": self.max_new_tokens if asked is None else min(int(asked), self.max_new_tokens)}

    async def generate(self, input_ids: list[int], sampling: dict, *, n: int = 1, top_logprobs: int = 0):
        choices = await self.inner.generate(input_ids, self._capped(sampling), n=n, top_logprobs=top_logprobs)
        self.tap.add(input_ids, [c.output_ids for c in choices])
        return choices

    async def generate_stream(self, input_ids: list[int], sampling: dict, *, top_logprobs: int = 0):
        chunks = await self.inner.generate_stream(input_ids, self._capped(sampling), top_logprobs=top_logprobs)

        async def tapped():
            try:
                async for chunk in chunks:
                    if chunk.done is not None:
                        self.tap.add(input_ids, [chunk.done.output_ids])
                    yield chunk
            finally:
                await chunks.aclose()

        return Stream(tapped(), chunks.aclose)


@dataclass
class OpenSession:
    id: str
    key: str
    base_url: str


class AgentGateway:
    """The run's gateway: `start(...)`, then `open`/`close` sessions per episode, `close_server()`."""

    def __init__(self, gateway: Gateway, server, tap: ServedTap, admin_key: str) -> None:
        self.gateway, self.server, self.tap, self.admin_key = gateway, server, tap, admin_key
        self.url = server.url
        self._expired: OrderedDict[str, SessionRecord] = OrderedDict()  # records of sessions that idled out

    @classmethod
    def start(cls, cfg, urls: list[str], model_path, *, limit: Callable[[], int | None], watchdog=None,
              router: str | None = None) -> "AgentGateway":
        from transformers import AutoTokenizer

        from agentrl_cli.engines.gateway.app import create_app
        from agentrl_cli.engines.inference.client import client_from_config
        from agentrl_cli.core.serving import ServerThread

        client = client_from_config(cfg, urls, router)  # the run's router, when it started one
        client.watchdog = watchdog
        context = min(cfg.model.context_length, cfg.training.seq_len_limit)
        inner = ClientBackend(client, AutoTokenizer.from_pretrained(str(model_path)), model_name=cfg.model.path,
                              context_length=context, resume=ResumePolicy.from_config(cfg))
        tap, admin_key = ServedTap(), secrets.token_urlsafe(24)
        holder: list[AgentGateway] = []
        gw = Gateway(RunBackend(inner, tap, cfg.inference.max_new_tokens), limit=limit, ttl_s=cfg.gateway.session_ttl_s,
                     retry_after_s=cfg.gateway.retry_after_s, on_expire=lambda record: holder[0]._keep_expired(record))
        server = ServerThread(create_app(gw, admin_key=admin_key), port=cfg.gateway.port, name="gateway").start()
        holder.append(cls(gw, server, tap, admin_key))
        return holder[0]

    def _keep_expired(self, record: SessionRecord) -> None:
        self._expired[record.session_id] = record
        while len(self._expired) > 1024:
            self._expired.popitem(last=False)

    def sandbox_config(self, cfg, needs_sandbox: Callable[[object], bool]):
        """`cfg` with the gateway's address on the allowlist of every harness `needs_sandbox` says
        runs its agent in a sandbox (network: allowlist; the rest of its allowlist kept)."""
        endpoint = f"127.0.0.1:{self.server.port}"
        harnesses = []
        for h in cfg.harnesses:
            if needs_sandbox(h):
                allow = list(h.allowlist if h.network == "allowlist" else []) + [endpoint]
                h = h.model_copy(update={"network": "allowlist", "allowlist": list(dict.fromkeys(allow))})
            harnesses.append(h)
        return cfg.model_copy(update={"harnesses": harnesses})

    def reward_access(self, session_id: str) -> tuple[str, str]:
        """(url, key) an agent posts its episode's reward with (`reward: harness`)."""
        return f"{self.url}/sessions/{session_id}/reward", self.admin_key

    async def open(self, meta: dict, deadline_s: float) -> OpenSession:
        """A new session; while the run's limit refuses one, wait `gateway.retry_after_s` and ask again
        (TimeoutError past `deadline_s` seconds)."""
        end = time.monotonic() + deadline_s
        while True:
            try:
                session = self.gateway.open_session(meta)
                return OpenSession(session.id, session.key, base_url(self.url, session.id))
            except Backpressure as exc:
                if time.monotonic() + exc.retry_after_s > end:
                    raise TimeoutError(f"the gateway refused a session for {deadline_s:g} s: {exc.message}") from None
                await asyncio.sleep(exc.retry_after_s)

    async def settle(self, session_id: str, timeout_s: float = SETTLE_S) -> None:
        """Wait (at most `timeout_s`) until no call of the session is in flight, so a call the agent
        left behind when it returned (a stream it stopped reading, being aborted) is counted in the
        record `close` takes."""
        end = time.monotonic() + timeout_s
        while self.gateway.calls_of(session_id) and time.monotonic() < end:
            await asyncio.sleep(0.01)

    def close(self, session_id: str) -> SessionRecord | None:
        """End the session; its record (the one kept when it expired; None when it is gone)."""
        try:
            return self.gateway.close_session(session_id)
        except OpenAIError:
            return self._expired.pop(session_id, None)

    def refused_calls(self) -> int:
        return int(self.gateway.counters["gateway/refused_calls"])

    def stats(self) -> dict:
        """The gateway's counters (`gateway/…`), without its two gauges."""
        return {k: v for k, v in self.gateway.stats().items() if k not in ("gateway/open_sessions", "gateway/calls_in_flight")}

    def close_server(self) -> None:
        """Stop serving; the client's connections are closed on the loop that made them."""
        client = self.gateway.backend.client
        loop = getattr(client, "_session_loop", None)
        if loop is not None and loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(client.close(), loop).result(10)
            except Exception:  # noqa: BLE001 - closing at the end of a run; its own outcome matters more
                log.exception("closing the gateway's inference client failed")
        self.server.stop()
