"""A finished chat call written as the Responses API answers: the Response object (`object:
"response"`, output items, usage) and its server-sent events in the documented order.

Output: the assistant's text as one `message` item with one `output_text` part (left out when the
turn is only tool calls), then one `function_call` item per parsed call (`call_id` the chat tool
call's id). Status: `completed` when the model stopped; `incomplete` with `incomplete_details.reason
= "max_output_tokens"` when it was cut by length (the openai Agents SDK raises on that, as it does
against OpenAI); `failed` when the generation was aborted. Usage: input, cached, output tokens.

Events: `response.created`, `response.in_progress`; per message item `response.output_item.added`,
`response.content_part.added`, `response.output_text.delta` (a token's text at a time when the text
is its tokens' text, as the chat stream), `response.output_text.done`, `response.content_part.done`,
`response.output_item.done`; per function call `response.output_item.added`,
`response.function_call_arguments.delta`, `response.function_call_arguments.done`,
`response.output_item.done`; then `response.completed` (or `response.incomplete` /
`response.failed`), each with a `sequence_number` from 0.

A call written as it is generated (`responses_live.py`) sends the same events from the same
pieces (`opening`, `message_added`, `text_delta`, `message_done`, `function_call`, `closing`), its
text deltas as the tokens come. Pure functions of the call; nothing here generates or validates.
"""

from __future__ import annotations

import copy
import time
from typing import AsyncIterator, Iterator

from agentrl_cli.engines.inference.protocol import dumps
from agentrl_cli.engines.openai_api.base import ChatCall
from agentrl_cli.engines.openai_api.responses_api import ResponsesIn, new_id

STATUS = {"stop": "completed", "tool_calls": "completed", "length": "incomplete"}


def _logprobs(entries: list | None) -> list[dict]:
    """Chat log-prob entries -> the Responses' (token, bytes, logprob, top_logprobs)."""
    return [{"token": e["token"], "bytes": e["bytes"], "logprob": e["logprob"],
             "top_logprobs": [{"token": t["token"], "bytes": t["bytes"], "logprob": t["logprob"]}
                              for t in e.get("top_logprobs") or ()]} for e in entries or ()]


def output_items(call: ChatCall, status: str, with_logprobs: bool, message_id: str | None = None) -> list[dict]:
    choice = call.response["choices"][0]
    message, calls = choice["message"], choice["message"].get("tool_calls") or []
    items = []
    if message.get("content") or not calls:
        part = {"type": "output_text", "text": message.get("content") or "", "annotations": []}
        if with_logprobs:
            part["logprobs"] = _logprobs((choice.get("logprobs") or {}).get("content"))
        items.append({"id": message_id or new_id("msg"), "type": "message", "role": "assistant", "status": status,
                      "content": [part]})
    for c in calls:
        items.append({"id": new_id("fc"), "type": "function_call", "call_id": c["id"], "name": c["function"]["name"],
                      "arguments": c["function"]["arguments"], "status": "completed"})
    return items


def usage(call: ChatCall) -> dict:
    u = call.response["usage"]
    cached = sum(c.cached_tokens for c in call.choices)
    return {"input_tokens": u["prompt_tokens"], "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
            "output_tokens": u["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u["total_tokens"]}


def response_fields(response_id: str, req: ResponsesIn, model: str, created_at: float) -> dict:
    """The Response as it is before the call is complete (`in_progress`, no output, no usage yet)."""
    return {
        "id": response_id, "object": "response", "created_at": created_at, "completed_at": None,
        "status": "in_progress", "error": None, "incomplete_details": None,
        "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
        "model": model, "output": [],
        "parallel_tool_calls": req.parallel_tool_calls is not False, "previous_response_id": req.previous_response_id,
        "reasoning": None, "store": req.store is not False, "temperature": 1.0 if req.temperature is None else req.temperature,
        "text": {"format": {"type": "text"}}, "tool_choice": req.tool_choice or "auto", "tools": list(req.tools or ()),
        "top_p": 1.0 if req.top_p is None else req.top_p, "top_logprobs": req.top_logprobs, "truncation": "disabled",
        "usage": None, "user": req.user, "safety_identifier": req.safety_identifier,
        "prompt_cache_key": req.prompt_cache_key, "metadata": req.metadata or {},
        "service_tier": "default",
    }


def response_object(response_id: str, req: ResponsesIn, call: ChatCall, created_at: float,
                    message_id: str | None = None) -> dict:
    """The Response of a finished call; `message_id`: its message item's id when one was announced."""
    finish = call.response["choices"][0]["finish_reason"]
    status = STATUS.get(finish, "failed")
    error = None if status != "failed" else {"code": "server_error",
                                             "message": f"the generation ended with {finish!r} (aborted by the server)"}
    return {**response_fields(response_id, req, call.response["model"], created_at),
            "completed_at": time.time(), "status": status, "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "output": output_items(call, status, req.logprobs, message_id), "usage": usage(call)}


def _text_deltas(call: ChatCall, text: str) -> list[tuple[str, list]]:
    if call.deltas:
        return list(call.deltas[0])
    return [(text, [])] if text else []


def opening(response: dict) -> Iterator[tuple[str, dict]]:
    """`response.created`, `response.in_progress` of a Response (as it is while in progress)."""
    pending = {**copy.deepcopy(response), "status": "in_progress", "output": [], "usage": None, "completed_at": None,
               "incomplete_details": None, "error": None}
    yield "response.created", {"response": pending}
    yield "response.in_progress", {"response": pending}


def message_added(item_id: str, index: int) -> Iterator[tuple[str, dict]]:
    """A message item opened (in progress, its one output_text part empty)."""
    yield "response.output_item.added", {"output_index": index, "item": {
        "id": item_id, "type": "message", "role": "assistant", "status": "in_progress", "content": []}}
    empty = {"type": "output_text", "text": "", "annotations": []}
    yield "response.content_part.added", {"item_id": item_id, "output_index": index, "content_index": 0, "part": empty}


def text_delta(item_id: str, index: int, text: str, entries: list | None, with_logprobs: bool) -> tuple[str, dict]:
    return "response.output_text.delta", {"item_id": item_id, "output_index": index, "content_index": 0,
                                          "delta": text, "logprobs": _logprobs(entries) if with_logprobs else []}


def message_done(item: dict, index: int) -> Iterator[tuple[str, dict]]:
    part, ids = item["content"][0], {"item_id": item["id"], "output_index": index}
    yield "response.output_text.done", {**ids, "content_index": 0, "text": part["text"],
                                        "logprobs": part.get("logprobs", [])}
    yield "response.content_part.done", {**ids, "content_index": 0, "part": part}
    yield "response.output_item.done", {"output_index": index, "item": item}


def function_call(item: dict, index: int) -> Iterator[tuple[str, dict]]:
    """A complete function call item: added, its arguments at once, done."""
    ids = {"item_id": item["id"], "output_index": index}
    yield "response.output_item.added", {"output_index": index, "item": {**item, "arguments": "",
                                                                        "status": "in_progress"}}
    yield "response.function_call_arguments.delta", {**ids, "delta": item["arguments"]}
    yield "response.function_call_arguments.done", {**ids, "name": item["name"], "arguments": item["arguments"]}
    yield "response.output_item.done", {"output_index": index, "item": item}


def closing(response: dict) -> tuple[str, dict]:
    """The final event of a finished Response: completed, incomplete or failed."""
    final = {"completed": "response.completed", "incomplete": "response.incomplete"}.get(response["status"],
                                                                                         "response.failed")
    return final, {"response": response}


def _events(response: dict, call: ChatCall) -> Iterator[tuple[str, dict]]:
    """(event type, fields) in order."""
    yield from opening(response)
    for index, item in enumerate(response["output"]):
        if item["type"] == "message":
            part = item["content"][0]
            yield from message_added(item["id"], index)
            for text, entries in _text_deltas(call, part["text"]):
                yield text_delta(item["id"], index, text, entries, "logprobs" in part)
            yield from message_done(item, index)
        else:
            yield from function_call(item, index)
    yield closing(response)


def event(kind: str, seq: int, **fields) -> str:
    data = dumps({"type": kind, "sequence_number": seq, **fields}).decode("utf-8")
    return f"event: {kind}\ndata: {data}\n\n"


async def response_events(response: dict, call: ChatCall) -> AsyncIterator[str]:
    """The Response as server-sent events (see the module docstring)."""
    for seq, (kind, fields) in enumerate(_events(response, call)):
        yield event(kind, seq, **fields)
