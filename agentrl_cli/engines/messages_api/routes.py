"""Mount `POST /v1/messages` (Anthropic's Messages API) on a FastAPI app served by an
`openai_api.Backend`: the request is translated to a chat completion (`request.to_chat`), served
by `openai_api.chat_completion` (the same render, generation and parsing as `/v1/chat/completions`,
and the same `on_call` hook a recorder uses), and answered as a `message` or its event stream
(`reply.py`). A streamed request on a backend that streams is written as it is generated
(`live.py`, `live_answer`; a client that goes away aborts the generation); otherwise the stream is
written once the call is complete. Errors are the Messages API's error object.

`ApiKeyHeader`: ASGI middleware for an app whose key check reads `Authorization: Bearer` only
(`core.security.BearerAuth`): on `/v1/messages` it hands an `x-api-key` header (what the anthropic
SDK sends) to that check as a bearer token, and writes a 401 in the Messages API's shape. Add it
after the key check so it runs first.
"""

from __future__ import annotations

import json
import logging
from typing import AsyncIterator, Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from agentrl_cli.engines.messages_api.reply import error_body, error_response, message_events, to_message
from agentrl_cli.engines.messages_api.request import to_chat
from agentrl_cli.engines.messages_api.live import live_message_events
from agentrl_cli.engines.openai_api import Backend, ChatCall, OpenAIError, chat_completion, chat_stream
from agentrl_cli.engines.openai_api.live import Delta, LiveChat, live_deltas
from agentrl_cli.engines.openai_api.routes import LiveStreamingResponse

log = logging.getLogger(__name__)
PATH = "/v1/messages"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


async def read_body(request: Request) -> dict:
    raw = await request.body()
    try:
        body = json.loads(raw) if raw.strip() else {}
    except ValueError as exc:
        raise OpenAIError(f"the request body is not valid JSON ({exc}); send Content-Type: application/json with a "
                          "JSON object") from None
    return body


def api_key_as_bearer(headers) -> str | None:
    """The Authorization header to check: `x-api-key` as a bearer token when given, else Authorization."""
    key = headers.get("x-api-key")
    return f"Bearer {key}" if key else headers.get("authorization")


def answer(call: ChatCall, body: dict):
    """The `message`, or its event stream, of a served call."""
    stops = list(body.get("stop_sequences") or ())
    if body.get("stream"):
        return StreamingResponse(message_events(chat_stream(call), input_tokens=len(call.prompt_ids),
                                                stop_sequences=stops),
                                 media_type="text/event-stream", headers=SSE_HEADERS)
    return JSONResponse(to_message(call.response, stops))


def live_answer(live: LiveChat, deltas: AsyncIterator[Delta], body: dict) -> LiveStreamingResponse:
    """The event stream of a call being generated (`live.py`); a client that goes away aborts it."""
    return LiveStreamingResponse(live_message_events(live, deltas, list(body.get("stop_sequences") or ())),
                                 media_type="text/event-stream", headers=SSE_HEADERS)


def add_messages_routes(app: FastAPI, backend: Backend, *,
                        on_call: Callable[[ChatCall], Awaitable[None]] | None = None) -> None:
    """Mount `POST /v1/messages` on `app`, served by `backend`; `on_call` as `add_openai_routes`'s."""

    @app.post(PATH)
    async def messages(request: Request):
        try:
            body = await read_body(request)
            chat = to_chat(body)
            started = await live_deltas(backend, chat, on_call=on_call) if chat.get("stream") else None
            if started is not None:
                return live_answer(*started, body)
            call = await chat_completion(backend, chat)
            if on_call is not None:
                await on_call(call)
        except OpenAIError as exc:
            return error_response(exc)
        except Exception as exc:  # noqa: BLE001 - a failed batch: answer 500 in the API's shape, keep serving
            log.exception("a Messages call failed")
            return error_response(OpenAIError(f"generation failed: {type(exc).__name__}: {exc}", status=500))
        return answer(call, body)


class ApiKeyHeader:
    """See the module docstring."""

    def __init__(self, app, *, path: str = PATH) -> None:
        self.app, self.path = app, path

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] != self.path:
            await self.app(scope, receive, send)
            return
        headers = [(k, v) for k, v in scope.get("headers") or () if k != b"authorization"]
        given = dict(scope.get("headers") or ())
        carried = api_key_as_bearer({k.decode("latin-1"): v.decode("latin-1") for k, v in given.items()})
        if carried:
            headers.append((b"authorization", carried.encode("latin-1")))
        refused = [False]
        body = json.dumps({"type": "error", **error_body(OpenAIError(
            "invalid x-api-key: send the server's API key as x-api-key (the anthropic SDK's api_key, "
            "ANTHROPIC_API_KEY) or as a bearer token", status=401))}).encode()

        async def send_shaped(message) -> None:
            if message["type"] == "http.response.start" and message["status"] == 401:
                refused[0] = True
                message = {**message, "headers": [(b"content-type", b"application/json"),
                                                  (b"content-length", str(len(body)).encode())]}
            elif message["type"] == "http.response.body" and refused[0]:
                message = {**message, "body": body if not message.get("more_body") else b""}
            await send(message)

        await self.app({**scope, "headers": headers}, receive, send_shaped)
