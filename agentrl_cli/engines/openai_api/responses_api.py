"""The OpenAI Responses API (`POST /v1/responses`) as a translation onto the chat path: a Responses
request (input as a string or items, `instructions`, function tools in the Responses' flat shape,
`previous_response_id`) becomes the chat-completions body of one call, which the server or the
recording gateway serves like any chat completion (same render, same parse, same record); the
finished call becomes a Response object (`responses_out.py`).

Input items: messages with role `user`, `system`, `developer` or `assistant` (content a string or
`input_text` / `output_text` / `refusal` parts), `function_call` and `function_call_output`. An
assistant message and the function calls after it are one assistant turn (content and
`tool_calls`), as the chat template renders it. `instructions` is the first system message; with
`previous_response_id` the stored conversation of that response (its input and its output, not
its instructions, as OpenAI documents) comes before the new input.

Refused, each as a 400 naming the field: an unknown field; a field of the API this server does not
serve set to anything but its default (`UNSUPPORTED`: background, conversations, stored prompts,
reasoning, structured output, ...); non-function tools; input items or content parts other than the
ones above (reasoning items: the model's format here has no reasoning parser, so this server never
returns any and cannot render one it is handed).
Taken though they change nothing: `client_metadata` (a client's tags for its own logs, as Codex CLI
sends them) and `include: ["reasoning.encrypted_content"]` (there are no reasoning items to include it on).

Not here: Response objects and events (`responses_out.py`), the store of responses
(`responses_store.py`), a stream written as generated (`responses_live.py`), HTTP (`routes.py`).
"""

from __future__ import annotations

import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationError

from agentrl_cli.engines.openai_api.base import OpenAIError
from agentrl_cli.engines.openai_api.protocol import _param

Number = StrictFloat | StrictInt
LOGPROBS = "message.output_text.logprobs"
# asked for on reasoning items, which this server never returns (no reasoning parser): nothing to leave out
ENCRYPTED_REASONING = "reasoning.encrypted_content"
INCLUDABLE = (LOGPROBS, ENCRYPTED_REASONING)


def _unset(value: Any) -> bool:
    return value is None or value is False or value == {} or value == []


# fields of the Responses API we parse but do not serve: refused unless unset (or the default named)
UNSUPPORTED: dict[str, tuple[Any, str]] = {
    "background": (_unset, "remove it: responses are generated in the request that asks for them"),
    "background_options": (_unset, "remove it: responses are generated in the request that asks for them"),
    "conversation": (_unset, "send previous_response_id instead (this server keeps responses, not conversations)"),
    "prompt": (_unset, "send instructions and input instead (no stored prompt templates)"),
    "reasoning": (lambda v: _unset(v) or all(x is None for x in v.values()) if isinstance(v, dict) else _unset(v),
                  "remove it: the model's format here has no reasoning parser"),
    "text": (lambda v: _unset(v) or v == {"format": {"type": "text"}},
             'only {"format": {"type": "text"}} is served (no constrained decoding): ask for JSON in the '
             "instructions and validate it yourself"),
    "truncation": (lambda v: v in (None, "disabled"),
                   'remove it or send "disabled": input is never truncated (a prompt past the context is a 400)'),
    "max_tool_calls": (lambda v: v is None, "remove it: the model's tool calls are not capped"),
    "service_tier": (lambda v: v in (None, "auto", "default"), 'remove it or send "auto"'),
    "context_management": (_unset, "remove it: the context is not compacted"),
    "prompt_cache_retention": (lambda v: v in (None, "in_memory"), 'remove it or send "in_memory"'),
    "prompt_cache_options": (_unset, "remove it: prefix caching is automatic"),
    "moderation": (_unset, "remove it: no moderation is run"),
    "image": (_unset, "remove it: the server serves text only"),
    "access_programs": (_unset, "remove it"),
    "stream_options": (lambda v: _unset(v) or v == {"include_obfuscation": False},
                       'remove it or send {"include_obfuscation": false}: events are not padded'),
}


class _Loose(BaseModel):
    model_config = ConfigDict(extra="ignore")


class FunctionToolIn(_Loose):
    type: Literal["function"]
    name: StrictStr
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None  # accepted; arguments are parsed, not constrained


class ResponsesIn(BaseModel):
    """A `/v1/responses` body, the Responses API's field names."""

    model_config = ConfigDict(extra="forbid")
    model: StrictStr | None = None
    input: StrictStr | list[Any] | None = None
    instructions: StrictStr | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: StrictBool | None = None
    max_output_tokens: StrictInt | None = None
    temperature: Number | None = None
    top_p: Number | None = None
    top_logprobs: StrictInt | None = None
    include: list[StrictStr] | None = None
    previous_response_id: StrictStr | None = None
    store: StrictBool | None = None
    stream: StrictBool | None = None
    metadata: dict[str, StrictStr] | None = None  # tags, echoed back
    user: StrictStr | None = None
    safety_identifier: StrictStr | None = None
    prompt_cache_key: StrictStr | None = None  # a hint; prefix caching is automatic
    # the client's tags for its own logs (Codex CLI sends its session and turn ids): accepted, never stored,
    # no effect on the generation; not in the openai package's types, but OpenAI's API takes it from Codex
    client_metadata: dict[str, StrictStr] | None = None
    # known, not served (UNSUPPORTED)
    background: Any = None
    background_options: Any = None
    conversation: Any = None
    prompt: Any = None
    reasoning: Any = None
    text: Any = None
    truncation: Any = None
    max_tool_calls: Any = None
    service_tier: Any = None
    context_management: Any = None
    prompt_cache_retention: Any = None
    prompt_cache_options: Any = None
    moderation: Any = None
    image: Any = None
    access_programs: Any = None
    stream_options: Any = None

    @property
    def logprobs(self) -> bool:
        return LOGPROBS in (self.include or ())


def _bad(param: str, message: str, code: str = "invalid_value") -> OpenAIError:
    return OpenAIError(message, param=param, code=code)


def parse_responses(body: Any) -> ResponsesIn:
    """A validated `/v1/responses` body (input items and tools are checked when translated)."""
    if not isinstance(body, dict):
        raise OpenAIError("The request body must be a JSON object.", code="invalid_request")
    try:
        req = ResponsesIn.model_validate(body)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = _param(err["loc"]) if err["loc"] else None
        if err["type"] == "extra_forbidden":
            raise _bad(param, f"Unrecognized request argument supplied: {param}. Remove it: this server takes the "
                              "fields of OpenAI's Responses API and refuses any other rather than ignore it.",
                       "unknown_parameter") from None
        raise _bad(param, f"Invalid value for '{param}': {err['msg']} (got {err.get('input')!r}).") from None
    for name, (ok, hint) in UNSUPPORTED.items():
        if not ok(getattr(req, name)):
            raise _bad(name, f"{name}={getattr(req, name)!r} is not supported by this server: {hint}.",
                       "unsupported_parameter")
    rules = [
        ("input", req.input not in (None, "", []) or req.previous_response_id is not None,
         "is required (a string or a list of input items)"),
        ("max_output_tokens", req.max_output_tokens is None or req.max_output_tokens >= 1, "must be at least 1"),
        ("temperature", req.temperature is None or 0 <= req.temperature <= 2, "must be in [0, 2]"),
        ("top_p", req.top_p is None or 0 < req.top_p <= 1, "must be in (0, 1]"),
        ("top_logprobs", req.top_logprobs is None or 0 <= req.top_logprobs <= 20, "must be in [0, 20]"),
        ("include", all(x in INCLUDABLE for x in req.include or ()),
         f"only {LOGPROBS!r} (and {ENCRYPTED_REASONING!r}, of which there is none: this server returns no "
         "reasoning items) can be included (nothing else this server returns is optional)"),
    ]
    for param, ok, rule in rules:
        if not ok:
            raise _bad(param, f"Invalid value for '{param}': {rule}.")
    return req


def chat_tools(tools: list[Any] | None) -> list[dict] | None:
    """Responses function tools (flat) -> chat tools (`{"type": "function", "function": {...}}`)."""
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise _bad(f"tools[{i}].type", f"tools[{i}]: tools of type {kind!r} are not served: this server runs no "
                                           "tools of its own; send function tools "
                                           '({"type": "function", "name": ..., "parameters": {...}}) and run them '
                                           "in the agent", "unsupported_parameter")
        try:
            fn = FunctionToolIn.model_validate(tool)
        except ValidationError as exc:
            err = exc.errors()[0]
            param = f"tools[{i}]." + _param(err["loc"])
            raise _bad(param, f"Invalid value for '{param}': {err['msg']} (got {err.get('input')!r}).") from None
        out.append({"type": "function", "function": fn.model_dump(exclude_none=True, exclude={"type"})})
    return out


def chat_tool_choice(choice: Any, tools: list[dict] | None) -> Any:
    """Responses' tool_choice -> the chat one; None when unset."""
    if choice is None or choice in ("none", "auto", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        if not any(t["function"]["name"] == choice["name"] for t in tools or ()):
            raise _bad("tool_choice", f"Invalid value for 'tool_choice': names {choice['name']!r}, which is not in tools.")
        return {"type": "function", "function": {"name": choice["name"]}}
    raise _bad("tool_choice", f"tool_choice={choice!r} is not supported by this server: send \"none\", \"auto\", "
                              '"required" or {"type": "function", "name": ...}.', "unsupported_parameter")


_PART_TEXT = {"input_text": "text", "output_text": "text", "refusal": "refusal"}


def _content_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(where, f"{where}: expected a string or a list of content parts, got {content!r}.")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        key = _PART_TEXT.get(kind)
        if key is None or not isinstance(part.get(key), str):
            raise _bad(f"{where}[{j}].type", f"{where}[{j}]: content part of type {kind!r} is not supported: the model "
                                             'reads text only; send {"type": "input_text", "text": "..."} parts or a '
                                             "string", "unsupported_parameter")
        texts.append(part[key])
    return "".join(texts)


def _item_kind(item: Any) -> str | None:
    if not isinstance(item, dict):
        return None
    return item.get("type") or ("message" if "role" in item else None)


def input_messages(items: str | list[Any] | None) -> list[dict]:
    """Input items -> chat messages; an assistant message and the function calls that follow it are
    one assistant turn. An OpenAIError names the first item it cannot take (`input[3].type`)."""
    if items is None:
        return []
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[dict] = []

    def turn() -> dict:
        """The assistant turn the item belongs to: the last message when it is one, else a new one."""
        if not out or out[-1]["role"] != "assistant" or out[-1].get("_closed"):
            out.append({"role": "assistant", "content": ""})
        return out[-1]

    for i, item in enumerate(items):
        where, kind = f"input[{i}]", _item_kind(item)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise _bad(f"{where}.role", f"{where}.role: expected user, system, developer or assistant, got {role!r}.")
            text = _content_text(item.get("content"), f"{where}.content")
            if role == "assistant":
                current = turn()
                if current.get("tool_calls"):  # text after a call of the same turn: a new turn
                    current["_closed"] = True
                    current = turn()
                current["content"] += text
            else:
                out.append({"role": role, "content": text})
        elif kind == "function_call":
            for key in ("call_id", "name", "arguments"):
                if not isinstance(item.get(key), str):
                    raise _bad(f"{where}.{key}", f"Missing required parameter: '{where}.{key}' (a string).",
                               "missing_required_parameter")
            turn().setdefault("tool_calls", []).append(
                {"id": item["call_id"], "type": "function", "function": {"name": item["name"],
                                                                         "arguments": item["arguments"]}})
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise _bad(f"{where}.call_id", f"Missing required parameter: '{where}.call_id'.",
                           "missing_required_parameter")
            out.append({"role": "tool", "tool_call_id": item["call_id"],
                        "content": _content_text(item.get("output"), f"{where}.output")})
        elif kind == "reasoning":
            raise _bad(f"{where}.type", f"{where}: reasoning items are not served: the model's format here has no "
                                        "reasoning parser, so this server never returns one and cannot render one it "
                                        "is handed; drop reasoning items from input", "unsupported_parameter")
        elif kind == "item_reference":
            raise _bad(f"{where}.type", f"{where}: item references are not served: send the item itself, or "
                                        "previous_response_id to continue a stored response", "unsupported_parameter")
        else:
            raise _bad(f"{where}.type", f"{where}: input items of type {kind!r} are not served: send messages, "
                                        "function_call and function_call_output items", "unsupported_parameter")
    for m in out:
        m.pop("_closed", None)
    return out


def reply_message(chat_response: dict) -> dict:
    """The assistant message a chat response returned, as a conversation continues it."""
    message = chat_response["choices"][0]["message"]
    out = {"role": "assistant", "content": message.get("content") or ""}
    if message.get("tool_calls"):
        out["tool_calls"] = [{"id": c["id"], "type": "function", "function": dict(c["function"])}
                             for c in message["tool_calls"]]
    return out


def chat_body(req: ResponsesIn, history: list[dict]) -> dict:
    """The chat-completions body of a Responses request: instructions, the stored `history` of its
    previous response, then its input; sampling and tools mapped one to one."""
    messages = ([{"role": "system", "content": req.instructions}] if req.instructions is not None else []) + \
        list(history) + input_messages(req.input)
    tools = chat_tools(req.tools)
    body: dict[str, Any] = {"messages": messages, "stream": bool(req.stream)}
    if req.model is not None:
        body["model"] = req.model
    if tools:
        body["tools"] = tools
    choice = chat_tool_choice(req.tool_choice, tools)
    if choice is not None:
        body["tool_choice"] = choice
    optional = {"parallel_tool_calls": req.parallel_tool_calls, "max_tokens": req.max_output_tokens,
                "temperature": req.temperature, "top_p": req.top_p, "user": req.user}
    body.update({k: v for k, v in optional.items() if v is not None})
    if req.logprobs:
        body["logprobs"] = True
        if req.top_logprobs:
            body["top_logprobs"] = req.top_logprobs
    elif req.top_logprobs:
        raise _bad("top_logprobs", f"Invalid value for 'top_logprobs': needs include=[{LOGPROBS!r}].")
    return body


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"
