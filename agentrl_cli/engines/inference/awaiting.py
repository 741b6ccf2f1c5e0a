"""Awaiting the embedded engine's requests from an event loop (the HTTP handlers of `/generate` and
the OpenAI-compatible routes): the results in order, and the requests aborted in the engine when
the awaiting task is cancelled (the client went away, the server stops), so no batch slot is held
for an answer nobody reads.

`stream_request` submits one request whose tokens are handed to the event loop as the scheduler
samples them (`batch.Request.on_token`); iterating it yields them as they come, and closing it
early (the client went away) aborts the request in the engine."""

from __future__ import annotations

import asyncio
import inspect
from concurrent.futures import Future
from typing import AsyncIterator, Callable


async def await_results(engine, futures: list[Future], rids: list[str]) -> list[dict]:
    try:
        return await asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
    except asyncio.CancelledError:
        for rid in rids:
            engine.abort(rid)
        raise


class Stream:
    """An async iterator over the async generator `gen` whose `aclose` also runs `cleanup` (a function,
    or one returning an awaitable) when `gen` never started: a generator's `finally` runs only once it
    has started, so closing a stream nobody read (a client gone before the first event) would
    otherwise leave its generation running."""

    def __init__(self, gen, cleanup: Callable) -> None:
        self.gen, self.cleanup = gen, cleanup
        self.started = self.closed = False

    def __aiter__(self) -> "Stream":
        return self

    async def __anext__(self):
        self.started = True
        return await self.gen.__anext__()

    async def aclose(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            if not self.started:
                done = self.cleanup()
                if inspect.isawaitable(done):
                    await done
        finally:
            await self.gen.aclose()


def stream_request(engine, spec: dict) -> AsyncIterator[tuple[list[int], list[float], str, dict | None]]:
    """Submit `spec` (one `engine.submit_many` entry, its `rid` set) now, raising what submitting
    raises; the iterator yields (new ids, their log-probs, weight version, None) as tokens are
    sampled, then (the ids not yet yielded, their log-probs, weight version, the engine's result).
    The ids yielded are the result's `output_ids`, in order. Call on the event loop that iterates."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()

    def put(item) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # the loop closed under a request nobody reads any more
            pass

    (future,) = engine.submit_many([{**spec, "on_token": lambda tok, lp, version: put((tok, lp, version))}])
    future.add_done_callback(lambda _: put(None))
    return Stream(_tokens(engine, spec["rid"], future, queue), lambda: future.done() or engine.abort(spec["rid"]))


async def _tokens(engine, rid: str, future: Future, queue: asyncio.Queue):
    sent = 0
    try:
        while True:
            items = [await queue.get()]
            while not queue.empty():
                items.append(queue.get_nowait())
            tokens = [i for i in items if i is not None]
            version = tokens[-1][2] if tokens else ""
            if None in items:
                result = future.result()  # the batch's exception, if it failed
                ids, logprobs = result["output_ids"], result["output_logprobs"]
                yield list(ids[sent:]), list(logprobs[sent:]), result["weight_version"], result
                return
            sent += len(tokens)
            yield [t for t, _, _ in tokens], [lp for _, lp, _ in tokens], version, None
    finally:
        if not future.done():
            engine.abort(rid)
