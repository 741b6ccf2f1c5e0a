"""A served chat completion -> the Messages API's answer: a `message` object, its server-sent
events, or its error object. Pure translation of OpenAI's wire objects (the `chat.completion`, the
`chat.completion.chunk` stream SGLang-style with `matched_stop`), so whatever serves the chat call
(the embedded engine, a recording gateway) serves the Messages call the same way.

- content: the turn's text as one `text` block (none when empty), then one `tool_use` block per
  parsed call (`input` the arguments object; id `toolu_<hex>`, the same hex as the chat call's
  `call_<hex>`, so a record's call id and the agent's tool_use id correspond).
- `stop_reason`: `tool_use` (the turn made calls), `max_tokens` (cut by length), `stop_sequence`
  (one of `stop_sequences` matched; `stop_sequence` names it), `end_turn` (the model ended its
  turn), `pause_turn` (the server aborted the generation: send the message back, last, and the
  reply continues it).
- id `msg_<hex>`, the same hex as the chat completion's `chatcmpl-<hex>` (what a gateway record
  names the call by); usage `input_tokens` / `output_tokens` (the stop token included, as in the
  chat usage), cache counts 0 (nothing is billed for caching).
- the stream: `message_start`, per block `content_block_start`, `content_block_delta` (`text_delta`
  as the chat stream's content deltas come; `input_json_delta` with the call's arguments) and
  `content_block_stop`, then `message_delta` (stop reason, usage) and `message_stop`; a failure
  after the stream began is an `error` event.
- errors: `{"type": "error", "error": {"type": ..., "message": ...}}`, the type by HTTP status.

A call written as it is generated streams the same events from the live call's deltas (`live.py`).

Not here: the request (`request.py`), HTTP (`routes.py`, the gateway's app).
"""

from __future__ import annotations

import json
import logging
from typing import AsyncIterator

from fastapi.responses import JSONResponse

from agentrl_cli.engines.openai_api import OpenAIError

log = logging.getLogger(__name__)
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
               503: "overloaded_error", 529: "overloaded_error"}


def _hex(openai_id: str, prefix: str) -> str:
    return openai_id[len(prefix):] if openai_id.startswith(prefix) else openai_id


def message_id(chat_id: str) -> str:
    return "msg_" + _hex(chat_id, "chatcmpl-")


def chat_id(call_id: str) -> str:
    """The chat completion id a Messages id names (`msg_<hex>` -> `chatcmpl-<hex>`); any other id as is."""
    return "chatcmpl-" + call_id[len("msg_"):] if call_id.startswith("msg_") else call_id


def tool_use_id(call_id: str) -> str:
    return "toolu_" + _hex(call_id, "call_")


def stop_reason(finish_reason: str | None, matched_stop, stop_sequences: list[str]) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) of a chat choice's finish."""
    if finish_reason == "tool_calls":
        return "tool_use", None
    if finish_reason == "length":
        return "max_tokens", None
    if finish_reason == "abort":
        return "pause_turn", None
    if isinstance(matched_stop, str) and matched_stop in stop_sequences:
        return "stop_sequence", matched_stop
    return "end_turn", None


def _input(arguments: str) -> dict:
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {"_raw": arguments}  # the parser hands out objects only


def usage_block(input_tokens: int, output_tokens: int) -> dict:
    return {"input_tokens": input_tokens, "output_tokens": output_tokens, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0}


def to_message(response: dict, stop_sequences: list[str] = ()) -> dict:
    """The `message` object of a (one-choice) `chat.completion`."""
    choice = response["choices"][0]
    msg = choice["message"]
    content = [{"type": "text", "text": msg["content"]}] if msg.get("content") else []
    content += [{"type": "tool_use", "id": tool_use_id(tc["id"]), "name": tc["function"]["name"],
                 "input": _input(tc["function"]["arguments"])} for tc in msg.get("tool_calls") or ()]
    reason, sequence = stop_reason(choice["finish_reason"], choice.get("matched_stop"), list(stop_sequences))
    usage = response["usage"]
    return {"id": message_id(response["id"]), "type": "message", "role": "assistant", "model": response["model"],
            "content": content, "stop_reason": reason, "stop_sequence": sequence,
            "usage": usage_block(usage["prompt_tokens"], usage["completion_tokens"])}


def event(kind: str, data: dict) -> str:
    """One server-sent event as the Messages API writes it (the SDK reads the `event:` line)."""
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data}, ensure_ascii=False)}\n\n"


def _chunks(lines: AsyncIterator[str]) -> AsyncIterator[dict]:
    async def parse():
        async for text in lines:
            for line in text.splitlines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    yield json.loads(line[len("data: "):])
    return parse()


async def message_events(chat_sse: AsyncIterator[str], *, input_tokens: int = 0,
                         stop_sequences: list[str] = ()) -> AsyncIterator[str]:
    """The Messages events of a one-choice chat stream (its `data:` lines, as `chat_stream` writes
    them with usage included); `input_tokens`: the prompt's, for `message_start` when known."""
    block = {"index": -1, "kind": None}  # the open content block
    finish, matched, usage, started = None, None, None, False

    def close() -> list[str]:
        if block["kind"] is None:
            return []
        block["kind"] = None
        return [event("content_block_stop", {"index": block["index"]})]

    def open_block(kind: str, content: dict) -> list[str]:
        out = close()
        block["index"] += 1
        block["kind"] = kind
        return out + [event("content_block_start", {"index": block["index"], "content_block": content})]

    try:
        async for chunk in _chunks(chat_sse):
            if not started:
                started = True
                yield event("message_start", {"message": {
                    "id": message_id(chunk["id"]), "type": "message", "role": "assistant", "model": chunk.get("model", ""),
                    "content": [], "stop_reason": None, "stop_sequence": None, "usage": usage_block(input_tokens, 0)}})
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or ():
                delta = choice.get("delta") or {}
                if delta.get("content"):
                    out = [] if block["kind"] == "text" else open_block("text", {"type": "text", "text": ""})
                    for line in out + [event("content_block_delta", {"index": block["index"], "delta": {
                            "type": "text_delta", "text": delta["content"]}})]:
                        yield line
                for tc in delta.get("tool_calls") or ():
                    fn = tc.get("function") or {}
                    if tc.get("id"):  # a new call (its arguments may follow in later chunks)
                        for line in open_block("tool_use", {"type": "tool_use", "id": tool_use_id(tc["id"]),
                                                            "name": fn.get("name", ""), "input": {}}):
                            yield line
                    if fn.get("arguments"):
                        yield event("content_block_delta", {"index": block["index"], "delta": {
                            "type": "input_json_delta", "partial_json": fn["arguments"]}})
                if choice.get("finish_reason"):
                    finish, matched = choice["finish_reason"], choice.get("matched_stop")
                    for line in close():
                        yield line
    except Exception as exc:  # noqa: BLE001 - the stream began: the failure is an event, not a status
        yield failure_event(exc)
        return
    for line in close():
        yield line
    reason, sequence = stop_reason(finish, matched, list(stop_sequences))
    usage = usage or {}
    yield event("message_delta", {"delta": {"stop_reason": reason, "stop_sequence": sequence},
                                  "usage": usage_block(usage.get("prompt_tokens", input_tokens),
                                                  usage.get("completion_tokens", 0))})
    yield event("message_stop", {})


def failure_event(exc: Exception) -> str:
    """The `error` event that ends a stream that failed after it began."""
    failure = exc if isinstance(exc, OpenAIError) else OpenAIError(
        f"generation failed: {type(exc).__name__}: {exc}", status=500, type="server_error")
    if not isinstance(exc, OpenAIError):
        log.exception("a Messages stream failed")
    return event("error", error_body(failure))


def error_type(status: int) -> str:
    return ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def error_body(exc: OpenAIError) -> dict:
    """`{"type": "error", "error": {...}}` of a refusal (`error` only, as an event's data)."""
    return {"error": {"type": error_type(exc.status), "message": exc.message}}


def error_response(exc: OpenAIError, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"type": "error", **error_body(exc)}, status_code=exc.status, headers=headers)
