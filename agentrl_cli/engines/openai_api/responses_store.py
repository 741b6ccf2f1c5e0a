"""The responses a server keeps for `previous_response_id` and `GET /v1/responses/{id}`, and the one
path both the embedded server and a gateway session take to answer `POST /v1/responses`: begun
(`begin_response`: validated, translated, named), served, finished (`finish_response`: the Response
built and stored) — in one go (`create_response`), or around a stream written as it is generated
(`responses_live.py`), which finishes the response once the call is complete, before its last events.

A stored response keeps its Response object and its conversation as chat messages (the history
before it, its input, its reply), so a follow-up continues exactly the messages the model saw:
the recording gateway then finds the earlier call's generated ids and continues its segment. The
store is bounded (`capacity`, oldest dropped first); a response created with `store: false` is not
kept. The embedded server keeps one store; the gateway one per session (its responses end with it).

Not here: translation (`responses_api.py`), Response objects (`responses_out.py`), HTTP.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Awaitable, Callable

from agentrl_cli.engines.openai_api.base import ChatCall, OpenAIError
from agentrl_cli.engines.openai_api.responses_api import ResponsesIn, chat_body, new_id, parse_responses, reply_message
from agentrl_cli.engines.openai_api.responses_out import response_object

# serve one chat-completions body; the response id is the id the call is served (and recorded) under
ServeChat = Callable[[dict, str], Awaitable[ChatCall]]


@dataclass
class Stored:
    response: dict
    conversation: list[dict]  # chat messages, without the instructions


class ResponseStore:
    def __init__(self, capacity: int = 1024) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, Stored] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, stored: Stored) -> None:
        self._items[stored.response["id"]] = stored
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def get(self, response_id: str, *, param: str | None = None) -> Stored:
        """The stored response; a 400 naming `param` (a follow-up's previous_response_id) or a 404."""
        stored = self._items.get(response_id)
        if stored is None:
            message = (f"Previous response with id {response_id!r} not found: previous_response_id must name a "
                       f"response stored here (not one created with store=false, dropped after {self.capacity} newer "
                       "ones, or of another or ended session)")
            if param is not None:
                raise OpenAIError(message, param=param, code="previous_response_not_found")
            raise OpenAIError(f"Response with id {response_id!r} not found.", status=404, type="invalid_request_error",
                              code="not_found")
        return stored

    def delete(self, response_id: str) -> dict:
        self.get(response_id)
        del self._items[response_id]
        return {"id": response_id, "object": "response", "deleted": True}


@dataclass
class Pending:
    """A `POST /v1/responses` validated and translated, not served yet: the chat body, the `resp_…`
    id it is served (and recorded) under."""

    request: ResponsesIn
    chat: dict
    response_id: str
    created_at: float


@dataclass
class Created:
    request: ResponsesIn
    response: dict
    call: ChatCall


def begin_response(body: dict, store: ResponseStore) -> Pending:
    """Validate, continue the previous response's conversation, name the response."""
    created_at = time.time()
    req = parse_responses(body)
    history = [] if req.previous_response_id is None else \
        store.get(req.previous_response_id, param="previous_response_id").conversation
    return Pending(req, chat_body(req, history), new_id("resp"), created_at)


def finish_response(pending: Pending, call: ChatCall, store: ResponseStore, message_id: str | None = None) -> dict:
    """The Response of the served call, stored unless `store: false`; `message_id` as
    `response_object`'s."""
    req = pending.request
    response = response_object(pending.response_id, req, call, pending.created_at, message_id)
    if req.store is not False:
        skip = 1 if req.instructions is not None else 0
        store.put(Stored(response, pending.chat["messages"][skip:] + [reply_message(call.response)]))
    return response


async def serve_response(pending: Pending, store: ResponseStore, serve: ServeChat) -> Created:
    """Serve a begun response whole: the chat call under its `resp_…` id, then its Response."""
    call = await serve(pending.chat, pending.response_id)
    return Created(pending.request, finish_response(pending, call, store), call)


async def create_response(body: dict, store: ResponseStore, serve: ServeChat) -> Created:
    """One `POST /v1/responses` answered once complete: validate, continue the previous response's
    conversation, serve the chat call under a new `resp_…` id, build (and store, unless `store:
    false`) the Response."""
    return await serve_response(begin_response(body, store), store, serve)
