"""Awaiting the embedded engine's requests from an event loop (the HTTP handlers of `/generate` and
the OpenAI-compatible routes): the results in order, and the requests aborted in the engine when
the awaiting task is cancelled (the client went away, the server stops), so no batch slot is held
for an answer nobody reads."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future


async def await_results(engine, futures: list[Future], rids: list[str]) -> list[dict]:
    try:
        return await asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
    except asyncio.CancelledError:
        for rid in rids:
            engine.abort(rid)
        raise
