"""The gateway over HTTP (FastAPI). An agent points the openai SDK at `base_url` with `api_key` from
POST /sessions; the run (or whoever runs the episodes) manages sessions and posts rewards.

    POST   /sessions                       {"meta": {...}?} -> {session_id, base_url, api_key, ttl_s}
    GET    /sessions/{id}                  the SessionRecord so far (segments, steps, rewards, counters)
    DELETE /sessions/{id}                  end it; its SessionRecord
    POST   /sessions/{id}/reward           {"reward": x} the episode's, {"reward": x, "call_id": "chatcmpl-..." / "resp_..."} one call's
                                           (a Messages call's "msg_..." id names its chat completion)
    POST   /s/{id}/v1/chat/completions     OpenAI chat completions (streamed as generated too), recorded token-exact
    POST   /s/{id}/v1/responses            OpenAI Responses (streamed as generated too), each a chat call recorded the same way
    GET    /s/{id}/v1/responses/{rid}      a response of the session (DELETE drops it); previous_response_id reads them
    POST   /s/{id}/v1/messages             Anthropic Messages (streamed as generated too; `engines/messages_api`), recorded
                                           as the chat completion it is translated to
    GET    /s/{id}/v1/models               the served model
    GET    /health, GET /stats             liveness; the gateway/ counters (admin)

The /s/ routes take the session's key as a bearer token (401 otherwise; /v1/messages takes it as
`x-api-key` too, and answers in the Messages API's error shape); the management routes take
one of `admin_key` when one is set (gateway.api_key: two keys at once during a rotation; an agent
holding only its session key can neither post its own reward nor read other sessions). Session
management that changes something (open, close, reward) and every refused management request is an
audit line (`core/security/audit.py`). Every error is OpenAI's error object; a 429 carries Retry-After.

Not here: what a call does (`service.py`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from agentrl_cli.engines.gateway.backend import describe
from agentrl_cli.engines.gateway.service import Backpressure, Gateway
from agentrl_cli.engines.gateway.sessions import base_url
from agentrl_cli.engines.messages_api import answer, api_key_as_bearer, chat_id, error_response, live_answer, to_chat
from agentrl_cli.engines.openai_api import OpenAIError, chat_stream
from agentrl_cli.engines.openai_api.responses_live import live_response
from agentrl_cli.engines.openai_api.responses_out import response_events
from agentrl_cli.engines.openai_api.responses_store import begin_response, serve_response
from agentrl_cli.engines.openai_api.routes import SSE_HEADERS, LiveStreamingResponse
from agentrl_cli.core.security import AuditLog, KeyRing, bearer_token

log = logging.getLogger(__name__)


async def _json(request: Request) -> dict:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise OpenAIError(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise OpenAIError("the request body must be a JSON object")
    return body


def create_app(gateway: Gateway, *, admin_key: KeyRing | str | None = None, public_url: str | None = None,
               audit: AuditLog | None = None) -> FastAPI:
    """The gateway's app. `admin_key`: the key(s) session management needs (None: none). `public_url`:
    the address agents reach the gateway at, when not the one the request came in on (a sandbox
    reaching it through a proxy). `audit`: where management writes and refusals are recorded."""
    admin_keys = KeyRing.coerce(admin_key)
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        yield
        close = getattr(gateway.backend, "aclose", None)
        if close is not None:
            await close()

    app = FastAPI(title="agentrl gateway", lifespan=lifespan)
    app.state.gateway = gateway
    created = int(time.time())

    @app.exception_handler(OpenAIError)
    async def openai_error(_: Request, exc: OpenAIError) -> JSONResponse:
        headers = exc.headers() if isinstance(exc, Backpressure) else None
        return JSONResponse(exc.body(), status_code=exc.status, headers=headers)

    @app.exception_handler(Exception)
    async def internal(_: Request, exc: Exception) -> JSONResponse:
        log.exception("gateway request failed")
        return JSONResponse(OpenAIError(f"internal gateway error: {type(exc).__name__}: {exc}", status=500,
                                        type="server_error").body(), status_code=500)

    def note(request: Request, key_id: str | None, status: int) -> None:
        if audit is not None:
            audit.record(key_id=key_id, method=request.method, endpoint=request.url.path, status=status,
                         client=request.client.host if request.client else None)

    def admin(request: Request) -> str | None:
        """The id of the admin key the request carries (None when none is needed); 401 otherwise."""
        if admin_keys is None:
            return None
        key_id = admin_keys.match(bearer_token(request.headers.get("authorization")))
        if key_id is None:
            gateway.counters["gateway/unauthorized"] += 1
            note(request, None, 401)
            raise OpenAIError("session management needs the gateway's admin key as a bearer token (gateway.api_key: "
                              "AGENTRL_GATEWAY__API_KEY_FILE for `agentrl serve gateway`, or the run's own)",
                              status=401, code="invalid_api_key")
        return key_id

    @contextlib.contextmanager
    def write(request: Request):
        """Admit a management write (`admin`) and audit it with the status it ends with."""
        key_id, status = admin(request), 500
        try:
            yield
            status = 200
        except OpenAIError as exc:
            status = exc.status
            raise
        finally:
            note(request, key_id, status)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "open_sessions": gateway.open_sessions(), **describe(gateway.backend)}

    @app.get("/stats")
    async def stats(request: Request) -> dict:
        admin(request)
        return gateway.stats()

    @app.post("/sessions")
    async def open_session(request: Request) -> dict:
        with write(request):
            body = await _json(request)
            meta = body.get("meta") or {}
            if not isinstance(meta, dict):
                raise OpenAIError(f"meta must be a JSON object, got {meta!r}", param="meta")
            session = gateway.open_session(meta)
        return {"session_id": session.id, "base_url": base_url(public_url or str(request.base_url), session.id),
                "api_key": session.key, "ttl_s": gateway.store.ttl_s}

    @app.get("/sessions/{session_id}")
    async def get_session(session_id: str, request: Request) -> dict:
        admin(request)
        return gateway.record(session_id).to_dict()

    @app.delete("/sessions/{session_id}")
    async def close_session(session_id: str, request: Request) -> dict:
        with write(request):
            return gateway.close_session(session_id).to_dict()

    @app.post("/sessions/{session_id}/reward")
    async def reward(session_id: str, request: Request) -> dict:
        with write(request):
            body = await _json(request)
            if "reward" not in body:
                raise OpenAIError('give {"reward": <number>} (and "call_id" for one call\'s reward)', param="reward")
            call_id = body.get("call_id")
            if call_id is not None and not isinstance(call_id, str):
                raise OpenAIError(f"call_id must be a chat completion's, a response's or a message's id (a string), got {call_id!r}",
                                  param="call_id")
            record = gateway.post_reward(session_id, body["reward"], None if call_id is None else chat_id(call_id))
        return {"session_id": session_id, "rewards": record.to_dict()["rewards"]}

    @app.post("/s/{session_id}/v1/chat/completions")
    async def chat(session_id: str, request: Request):
        session = gateway.authorize(session_id, request.headers.get("authorization"))
        body = await _json(request)
        if body.get("stream"):
            events = await gateway.chat_stream(session, body)
            if events is not None:
                return LiveStreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)
        call = await gateway.chat(session, body)
        if call.request.get("stream"):
            return StreamingResponse(chat_stream(call), media_type="text/event-stream")
        return JSONResponse(call.response)

    @app.post("/s/{session_id}/v1/responses")
    async def responses(session_id: str, request: Request):
        session = gateway.authorize(session_id, request.headers.get("authorization"))

        async def serve(body: dict, response_id: str):
            return await gateway.chat(session, body, call_id=response_id)

        async def start_live(body: dict, response_id: str):
            return await gateway.chat_deltas(session, body, call_id=response_id)

        pending = begin_response(await _json(request), session.responses)
        events = await live_response(pending, session.responses, start_live)
        if events is not None:
            return LiveStreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)
        created = await serve_response(pending, session.responses, serve)
        if created.request.stream:
            return StreamingResponse(response_events(created.response, created.call), media_type="text/event-stream")
        return JSONResponse(created.response)

    @app.get("/s/{session_id}/v1/responses/{response_id}")
    async def response(session_id: str, response_id: str, request: Request):
        session = gateway.authorize(session_id, request.headers.get("authorization"))
        return JSONResponse(session.responses.get(response_id).response)

    @app.delete("/s/{session_id}/v1/responses/{response_id}")
    async def delete_response(session_id: str, response_id: str, request: Request):
        session = gateway.authorize(session_id, request.headers.get("authorization"))
        return JSONResponse(session.responses.delete(response_id))

    @app.post("/s/{session_id}/v1/messages")
    async def messages(session_id: str, request: Request):
        try:
            session = gateway.authorize(session_id, api_key_as_bearer(request.headers))
            body = await _json(request)
            chat = to_chat(body)
            started = await gateway.chat_deltas(session, chat) if chat.get("stream") else None
            if started is not None:
                return live_answer(*started, body)
            call = await gateway.chat(session, chat)
        except OpenAIError as exc:
            if exc.status == 401 and not api_key_as_bearer(request.headers):
                exc.message = ("no API key: send the session's key as x-api-key (the anthropic SDK's api_key, or "
                               "ANTHROPIC_API_KEY) or as a bearer token, from the POST /sessions answer")
            return error_response(exc, exc.headers() if isinstance(exc, Backpressure) else None)
        except Exception as exc:  # noqa: BLE001 - answered in the Messages API's shape, as the app's handler does
            log.exception("gateway Messages call failed")
            return error_response(OpenAIError(f"internal gateway error: {type(exc).__name__}: {exc}", status=500))
        return answer(call, body)

    @app.get("/s/{session_id}/v1/models")
    async def models(session_id: str, request: Request) -> dict:
        gateway.authorize(session_id, request.headers.get("authorization"))
        name = gateway.backend.model_name()
        return {"object": "list", "data": [{"id": name, "object": "model", "created": created, "owned_by": "agentrl",
                                            "root": name}]}

    @app.post("/s/{session_id}/v1/completions")
    async def completions(session_id: str, request: Request):
        gateway.authorize(session_id, request.headers.get("authorization"))
        raise OpenAIError("the gateway records chat completions only: use POST .../v1/chat/completions (text "
                          "completions carry no messages to stitch into a trajectory)", status=404, type="not_found_error")

    return app
