"""A streamed `POST /v1/responses` written as its tokens are generated: the Responses events of a
live call's `Delta`s (`live.py`; on a gateway, the recorded ones of `Gateway.chat_deltas`), in the
order `responses_out.py` documents, from the same pieces a finished call's stream is written with.

What is sent when:
- `response.created`, `response.in_progress` with the first tokens;
- the message item (`response.output_item.added`, `response.content_part.added`) with the first
  text, then a `response.output_text.delta` per content delta as it comes: the text the chat stream
  sends, which holds back everything from a `<tool_call>` opening on, so a function call is never
  guessed from partial text;
- once the call is complete (recorded by then, on a gateway): the Response built and stored
  (`finish_response`, so a follow-up's `previous_response_id` finds it), the message item closed,
  one `function_call` item per call the model's format parsed (its arguments at once), and the
  final event (`response.completed`, `.incomplete` or `.failed`).
A failure after the stream began ends it with `response.failed` carrying the error. A client that
goes away closes the deltas: the generation is aborted, nothing is stored (nor recorded).

Not here: the events' shapes (`responses_out.py`), the store (`responses_store.py`), HTTP.
"""

from __future__ import annotations

import itertools
import logging
from typing import AsyncIterator, Awaitable, Callable

from agentrl_cli.engines.inference.awaiting import Stream
from agentrl_cli.engines.openai_api.base import OpenAIError
from agentrl_cli.engines.openai_api.live import Delta, LiveChat
from agentrl_cli.engines.openai_api.responses_api import new_id
from agentrl_cli.engines.openai_api.responses_out import (closing, event, function_call, message_added, message_done,
                                                          opening, response_fields, text_delta)
from agentrl_cli.engines.openai_api.responses_store import Pending, ResponseStore, finish_response

log = logging.getLogger(__name__)
# submit a chat body live under a response id: the call and its deltas, None when it cannot stream live
StartLive = Callable[[dict, str], Awaitable["tuple[LiveChat, AsyncIterator[Delta]] | None"]]


async def live_response(pending: Pending, store: ResponseStore, start: StartLive) -> AsyncIterator[str] | None:
    """The events of a streamed response written as it is generated; None when the request does not
    stream or the call cannot stream live (n > 1, a backend that does not stream: answer it whole)."""
    if not pending.request.stream:
        return None
    started = await start(pending.chat, pending.response_id)
    if started is None:
        return None
    live, deltas = started
    return Stream(_events(pending, live, deltas, store), deltas.aclose)


async def _events(pending: Pending, live: LiveChat, deltas: AsyncIterator[Delta],
                  store: ResponseStore) -> AsyncIterator[str]:
    seq = itertools.count()
    req, item_id = pending.request, new_id("msg")
    opened, began, held = False, False, []  # held: log-prob-only deltas before the message item opens

    def out(kind: str, fields: dict) -> str:
        return event(kind, next(seq), **fields)

    def open_message() -> list[str]:
        lines = [out(*e) for e in message_added(item_id, 0)]
        lines += [out(*text_delta(item_id, 0, text, entries, req.logprobs)) for text, entries in held]
        held.clear()
        return lines

    try:
        async for d in deltas:
            if d.kind == "start":
                began = True
                for e in opening(response_fields(pending.response_id, req, live.model, pending.created_at)):
                    yield out(*e)
            elif d.kind == "content" and not opened and not d.text:
                held.append((d.text, d.logprobs))
            elif d.kind == "content":
                if not opened:
                    opened = True
                    for line in open_message():
                        yield line
                yield out(*text_delta(item_id, 0, d.text, d.logprobs, req.logprobs))
            else:
                response = finish_response(pending, d.call, store, item_id)
                for index, item in enumerate(response["output"]):
                    if item["type"] == "message":
                        for line in [] if opened else open_message():
                            yield line
                        for e in message_done(item, index):
                            yield out(*e)
                    else:
                        for e in function_call(item, index):
                            yield out(*e)
                yield out(*closing(response))
    except Exception as exc:  # noqa: BLE001 - the stream began: the failure is its last event
        if not isinstance(exc, OpenAIError):
            log.exception("a live Responses stream failed")
        failed = response_fields(pending.response_id, req, live.model, pending.created_at)
        failed.update(status="failed", error={"code": "server_error", "message": f"generation failed: {exc}"})
        if not began:
            for e in opening(failed):
                yield out(*e)
        yield out(*closing(failed))
    finally:
        await deltas.aclose()
