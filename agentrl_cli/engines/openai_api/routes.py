"""Mount the OpenAI-compatible endpoints on a FastAPI app: `POST /v1/chat/completions` (streamed
or not), `POST /v1/completions`, `GET /v1/models`, and the Responses API (`POST /v1/responses`,
`GET` and `DELETE /v1/responses/{id}`, kept in a bounded `ResponseStore`). The app's owner keeps its middleware (the
embedded server's API key covers `/v1`); this module only routes and writes errors as OpenAI's
error object. `on_call` sees every chat call, token-exact, before the client gets its answer (a
recording gateway's hook; for a stream written as generated, before its last content and finish
chunks); an `OpenAIError` it raises is the client's answer instead (a live stream just ends).
A streamed call (a chat completion or a response) is written as it is generated when the backend
streams (`live.py`, `responses_live.py`); a client that goes away mid-stream aborts its generation
(`LiveStreamingResponse`).
"""

from __future__ import annotations

import json
import logging
from typing import Awaitable, Callable

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from agentrl_cli.engines.inference.protocol import dumps
from agentrl_cli.engines.openai_api.base import Backend, ChatCall, OpenAIError
from agentrl_cli.engines.openai_api.live import live_chat, live_deltas
from agentrl_cli.engines.openai_api.responses_live import live_response
from agentrl_cli.engines.openai_api.responses_out import response_events
from agentrl_cli.engines.openai_api.responses_store import ResponseStore, begin_response, serve_response
from agentrl_cli.engines.openai_api.service import (chat_completion, chat_stream, completion_stream, prepare_chat,
                                                    text_completion)

log = logging.getLogger(__name__)
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class LiveStreamingResponse(StreamingResponse):
    """A stream that notices its client going away while it waits for tokens (it listens for the
    disconnect beside sending, whatever ASGI version the server speaks) and closes its body iterator
    however it ends, so the generation behind it is aborted at once."""

    async def __call__(self, scope, receive, send) -> None:
        try:
            async with anyio.create_task_group() as group:
                async def stream() -> None:
                    try:
                        await self.stream_response(send)
                    except OSError:  # the client is gone
                        pass
                    group.cancel_scope.cancel()

                group.start_soon(stream)
                await self.listen_for_disconnect(receive)
                group.cancel_scope.cancel()
        finally:
            close = getattr(self.body_iterator, "aclose", None)
            if close is not None:
                await close()


def error_response(exc: OpenAIError) -> Response:
    return Response(dumps(exc.body()), status_code=exc.status, media_type="application/json")


async def _body(request: Request) -> dict:
    raw = await request.body()
    try:
        return json.loads(raw) if raw.strip() else {}
    except ValueError as exc:
        raise OpenAIError(f"The request body is not valid JSON ({exc}); send Content-Type: application/json with a "
                          "JSON object.", code="invalid_json") from None


def _failed(exc: Exception) -> Response:
    log.exception("OpenAI-compatible call failed")
    return error_response(OpenAIError(f"generation failed: {type(exc).__name__}: {exc}", status=500,
                                      type="server_error"))


def models_body(backend: Backend) -> dict:
    name = backend.model_name()
    return {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "sglang",
                                        "root": name, "parent": None,
                                        "max_model_len": getattr(backend, "context_length", None)}]}


def add_openai_routes(app: FastAPI, backend: Backend, *,
                      on_call: Callable[[ChatCall], Awaitable[None]] | None = None) -> None:
    """Mount the endpoints on `app`, served by `backend`."""

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        try:
            body = await _body(request)
            prepared = prepare_chat(backend, body)
            live = await live_chat(backend, prepared)
            if live is not None:
                return LiveStreamingResponse(live.events(on_call), media_type="text/event-stream", headers=SSE_HEADERS)
            call = await chat_completion(backend, body, prepared)
            if on_call is not None:
                await on_call(call)
        except OpenAIError as exc:
            return error_response(exc)
        except Exception as exc:  # noqa: BLE001 - a failed batch: answer 500 in OpenAI's shape, keep serving
            return _failed(exc)
        if call.deltas is not None:
            return StreamingResponse(chat_stream(call), media_type="text/event-stream", headers=SSE_HEADERS)
        return Response(dumps(call.response), media_type="application/json")

    @app.post("/v1/completions")
    async def completions(request: Request):
        try:
            body = await _body(request)
            response = await text_completion(backend, body)
        except OpenAIError as exc:
            return error_response(exc)
        except Exception as exc:  # noqa: BLE001 - as above
            return _failed(exc)
        if body.get("stream"):
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(completion_stream(response, usage), media_type="text/event-stream",
                                     headers=SSE_HEADERS)
        return Response(dumps(response), media_type="application/json")

    @app.get("/v1/models")
    async def models():
        return Response(dumps(models_body(backend)), media_type="application/json")

    responses = ResponseStore()

    async def serve(body: dict, response_id: str) -> ChatCall:
        call = await chat_completion(backend, body)
        call.response["id"] = response_id  # the call is the response: a hook keeps it under the served id
        if on_call is not None:
            await on_call(call)
        return call

    async def start_live(body: dict, response_id: str):
        return await live_deltas(backend, body, on_call=on_call, call_id=response_id)

    @app.post("/v1/responses")
    async def create(request: Request):
        try:
            pending = begin_response(await _body(request), responses)
            events = await live_response(pending, responses, start_live)
            if events is not None:
                return LiveStreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)
            created = await serve_response(pending, responses, serve)
        except OpenAIError as exc:
            return error_response(exc)
        except Exception as exc:  # noqa: BLE001 - as above
            return _failed(exc)
        if created.request.stream:
            return StreamingResponse(response_events(created.response, created.call), media_type="text/event-stream",
                                     headers=SSE_HEADERS)
        return Response(dumps(created.response), media_type="application/json")

    @app.get("/v1/responses/{response_id}")
    async def retrieve(response_id: str):
        try:
            return Response(dumps(responses.get(response_id).response), media_type="application/json")
        except OpenAIError as exc:
            return error_response(exc)

    @app.delete("/v1/responses/{response_id}")
    async def delete(response_id: str):
        try:
            return Response(dumps(responses.delete(response_id)), media_type="application/json")
        except OpenAIError as exc:
            return error_response(exc)
