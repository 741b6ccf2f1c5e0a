"""An Anthropic Messages request (`POST /v1/messages`) -> the chat-completion body the
OpenAI-compatible layer serves (`openai_api.chat_completion`), so a Messages call is rendered,
generated, parsed and (through a gateway) recorded exactly as a chat completion is.

The translation, field by field (the `anthropic` SDK's `MessageCreateParams`):
- `system` (a string or text blocks) -> a leading system message; a `system` role in `messages` too.
- `messages[].content`: a string, or blocks: `text` (joined with newlines), `tool_use` (an
  assistant's call -> `tool_calls`, its `input` object as the arguments, its id kept), `tool_result`
  (-> a `tool` message answering `tool_use_id`; content a string or text blocks; `is_error: true`
  is shown to the model as "Error: " before the text, since chat templates have no error flag).
  A user message's text blocks after its tool results become a user message after them. An
  assistant message last is a prefill the reply continues (`continue_final_message`).
- `tools[]` (custom tools: `name`, `description`, `input_schema`) -> function tools;
  `tool_choice` auto / any / tool / none -> "auto" / "required" / the named function / "none";
  `disable_parallel_tool_use` -> `parallel_tool_calls: false`.
- `max_tokens` (required), `temperature` (0 to 1), `top_p`, `top_k`, `stop_sequences`, `stream`.

Accepted and ignored, because they never change what is generated: `cache_control` (a prompt-caching
breakpoint, on the request or any block or tool: the engine's prefix cache works without it),
`metadata` (tags), `service_tier`, a tool's `eager_input_streaming` (tool input is streamed once
the call is complete), `thinking: {"type": "disabled"}`, `speed: "standard"`.
Refused, naming the field: any block but text / tool_use / tool_result (images, documents,
thinking, server tool results), server tools (bash, text editor, web search, ...), `thinking`,
`output_config`, `container`, `mcp_servers` and every field the API does not have. Every refusal is
an `OpenAIError` (HTTP 400) that `reply.error_response` writes in the Messages API's error shape.

Not here: the reply (`reply.py`), HTTP (`routes.py`, and the gateway's app).
"""

from __future__ import annotations

import json
import math
from typing import Any

from agentrl_cli.engines.openai_api import OpenAIError

REQUIRED = ("model", "max_tokens", "messages")
HINTS = {"cache_control", "metadata", "service_tier"}  # accepted, ignored: they change nothing generated
SAMPLING = ("temperature", "top_p", "top_k", "stop_sequences")
# fields of the Messages API this server does not implement: accepted only at the value named
UNSUPPORTED: dict[str, tuple[Any, str]] = {
    "thinking": ({"type": "disabled"}, "extended thinking is not served: remove it or send {\"type\": \"disabled\"}"),
    "speed": ("standard", 'remove it or send "standard"'),
    "output_config": (None, "structured outputs and effort levels are not served: remove it and validate the "
                            "text yourself"),
    "container": (None, "this server runs no containers: remove it"),
    "mcp_servers": (None, "this server connects to no MCP servers: run the tools in the agent and declare them "
                          "in tools"),
    "context_management": (None, "remove it: the server does not edit the context"),
    "diagnostics": (None, "remove it: the server has no cache diagnostics"),
    "inference_geo": (None, "remove it: the server runs where it runs"),
    "user_profile_id": (None, "remove it: the server has no user profiles"),
    "workspace_id": (None, "remove it: the server has no workspaces"),
}
KNOWN = {*REQUIRED, *HINTS, *SAMPLING, *UNSUPPORTED, "system", "tools", "tool_choice", "stream"}
TOOL_FIELDS = {"name", "description", "input_schema", "type", "cache_control", "strict", "eager_input_streaming"}
BLOCK_FIELDS = {"text": {"type", "text", "cache_control", "citations"},
                "tool_use": {"type", "id", "name", "input", "cache_control", "caller"},
                "tool_result": {"type", "tool_use_id", "content", "is_error", "cache_control"}}


def _bad(param: str, message: str) -> OpenAIError:
    return OpenAIError(f"{param}: {message}", param=param, code="invalid_value")


def _number(body: dict, key: str, low: float, high: float | None) -> None:
    value = body.get(key)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _bad(key, f"expected a number, got {value!r}")
    if value < low or (high is not None and value > high):
        raise _bad(key, f"must be in [{low:g}, {high:g}], got {value!r}" if high is not None else
                   f"must be at least {low:g}, got {value!r}")


def _check_fields(body: dict) -> None:
    for key in body:
        if key not in KNOWN:
            raise OpenAIError(f"{key}: Extra inputs are not permitted (this server takes the Messages API's fields "
                              "and refuses any other rather than ignore it)", param=key, code="unknown_parameter")
    for key in REQUIRED:
        if key not in body:
            raise OpenAIError(f"{key}: Field required", param=key, code="missing_required_parameter")
    for key, (allowed, hint) in UNSUPPORTED.items():
        if body.get(key) not in (None, allowed):
            raise OpenAIError(f"{key}={body[key]!r} is not supported by this server: {hint}", param=key,
                              code="unsupported_parameter")
    if not isinstance(body["model"], str):
        raise _bad("model", f"expected a string, got {body['model']!r}")
    max_tokens = body["max_tokens"]
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise _bad("max_tokens", f"expected an integer of at least 1, got {max_tokens!r}")
    _number(body, "temperature", 0, 1)
    _number(body, "top_p", 0, 1)
    if body.get("top_p") == 0:
        raise _bad("top_p", "must be above 0 (0 keeps no token; use temperature 0 for greedy decoding)")
    top_k = body.get("top_k")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise _bad("top_k", f"expected an integer of at least 1, got {top_k!r}")
    stops = body.get("stop_sequences")
    if stops is not None and (not isinstance(stops, list) or not all(isinstance(s, str) and s.strip() for s in stops)):
        raise _bad("stop_sequences", f"expected a list of non-blank strings, got {stops!r}")
    if not isinstance(body.get("stream", False), bool):
        raise _bad("stream", f"expected true or false, got {body['stream']!r}")


def _block_type(block: Any, where: str, allowed: tuple[str, ...]) -> str:
    kind = block.get("type") if isinstance(block, dict) else None
    if kind not in allowed:
        raise OpenAIError(f"{where}.type: content block type {kind!r} is not supported here: this server takes "
                          f"{', '.join(allowed)} blocks (the model reads text only; no images, documents or thinking)",
                          param=f"{where}.type", code="unsupported_parameter")
    for key, value in block.items():
        if key not in BLOCK_FIELDS[kind] and value is not None:  # the SDK echoes a block's unset fields as null
            raise OpenAIError(f"{where}.{key}: Extra inputs are not permitted", param=f"{where}.{key}",
                              code="unknown_parameter")
    if block.get("citations"):
        raise OpenAIError(f"{where}.citations: citations are not supported: remove them", param=f"{where}.citations",
                          code="unsupported_parameter")
    return kind


def _block_text(block: dict, where: str) -> str:
    if not isinstance(block.get("text"), str):
        raise _bad(f"{where}.text", f"expected a string, got {block.get('text')!r}")
    return block["text"]


def _text(content: Any, where: str) -> str:
    """A string, or text blocks joined with newlines."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(where, f"expected a string or a list of text blocks, got {content!r}")
    texts = []
    for j, block in enumerate(content):
        _block_type(block, f"{where}[{j}]", ("text",))
        texts.append(_block_text(block, f"{where}[{j}]"))
    return "\n".join(texts)


def _tool_result(block: dict, where: str) -> dict:
    if not isinstance(block.get("tool_use_id"), str):
        raise _bad(f"{where}.tool_use_id", f"expected the id of the tool_use it answers, got {block.get('tool_use_id')!r}")
    text = _text(block.get("content", ""), f"{where}.content")
    if block.get("is_error"):
        text = f"Error: {text}" if text else "Error"
    return {"role": "tool", "tool_call_id": block["tool_use_id"], "content": text}


def _tool_use(block: dict, where: str) -> dict:
    for key in ("id", "name"):
        if not isinstance(block.get(key), str) or not block[key]:
            raise _bad(f"{where}.{key}", f"expected a non-empty string, got {block.get(key)!r}")
    if not isinstance(block.get("input"), dict):
        raise _bad(f"{where}.input", f"expected a JSON object, got {block.get('input')!r}")
    return {"id": block["id"], "type": "function",
            "function": {"name": block["name"], "arguments": json.dumps(block["input"], ensure_ascii=False)}}


def _user(content: Any, where: str) -> list[dict]:
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    if not isinstance(content, list):
        raise _bad(where, f"expected a string or a list of content blocks, got {content!r}")
    out, texts = [], []
    for j, block in enumerate(content):
        at = f"{where}[{j}]"
        if _block_type(block, at, ("text", "tool_result")) == "tool_result":
            if texts:
                out.append({"role": "user", "content": "\n".join(texts)})
                texts = []
            out.append(_tool_result(block, at))
        else:
            texts.append(_block_text(block, at))
    if texts or not out:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _assistant(content: Any, where: str) -> dict:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    if not isinstance(content, list):
        raise _bad(where, f"expected a string or a list of content blocks, got {content!r}")
    texts, calls = [], []
    for j, block in enumerate(content):
        at = f"{where}[{j}]"
        if _block_type(block, at, ("text", "tool_use")) == "tool_use":
            calls.append(_tool_use(block, at))
        else:
            texts.append(_block_text(block, at))
    message = {"role": "assistant", "content": "\n".join(texts)}
    if calls:
        message["tool_calls"] = calls
    return message


def _messages(body: dict) -> list[dict]:
    raw = body["messages"]
    if not isinstance(raw, list) or not raw:
        raise _bad("messages", f"expected a non-empty list of messages, got {raw!r}")
    out = []
    if body.get("system") not in (None, "", []):
        out.append({"role": "system", "content": _text(body["system"], "system")})
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant", "system"):
            raise _bad(f"{where}.role", f"expected a message with role user or assistant, got {m!r}")
        extra = set(m) - {"role", "content"}
        if extra:
            raise OpenAIError(f"{where}.{sorted(extra)[0]}: Extra inputs are not permitted",
                              param=f"{where}.{sorted(extra)[0]}", code="unknown_parameter")
        if "content" not in m:
            raise OpenAIError(f"{where}.content: Field required", param=f"{where}.content",
                              code="missing_required_parameter")
        if m["role"] == "user":
            out += _user(m["content"], f"{where}.content")
        elif m["role"] == "assistant":
            out.append(_assistant(m["content"], f"{where}.content"))
        else:
            out.append({"role": "system", "content": _text(m["content"], f"{where}.content")})
    return out


def _tools(raw: Any) -> list[dict]:
    if not isinstance(raw, list):
        raise _bad("tools", f"expected a list of tools, got {raw!r}")
    out = []
    for i, tool in enumerate(raw):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise _bad(where, f"expected a tool object, got {tool!r}")
        if tool.get("type") not in (None, "custom"):
            raise OpenAIError(f"{where}.type: tool type {tool['type']!r} is not supported: this server runs no tools "
                              "of its own; declare it as a custom tool (name, description, input_schema) and run it "
                              "in the agent", param=f"{where}.type", code="unsupported_parameter")
        for key in tool:
            if key not in TOOL_FIELDS:
                raise OpenAIError(f"{where}.{key}: Extra inputs are not permitted (not supported by this server)",
                                  param=f"{where}.{key}", code="unknown_parameter")
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise _bad(f"{where}.name", f"expected a non-empty string, got {tool.get('name')!r}")
        if not isinstance(tool.get("input_schema"), dict):
            raise _bad(f"{where}.input_schema", f"expected a JSON schema object, got {tool.get('input_schema')!r}")
        fn = {"name": tool["name"]}
        if isinstance(tool.get("description"), str):
            fn["description"] = tool["description"]
        fn["parameters"] = tool["input_schema"]
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(raw: Any, names: list[str]) -> tuple[Any, bool]:
    """(the chat tool_choice, parallel_tool_calls)."""
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind not in ("auto", "any", "tool", "none"):
        raise _bad("tool_choice", 'expected {"type": "auto"}, {"type": "any"}, {"type": "tool", "name": ...} or '
                   f'{{"type": "none"}}, got {raw!r}')
    parallel = not raw.get("disable_parallel_tool_use", False)
    if kind in ("any", "tool") and not names:
        raise _bad("tool_choice", f'{{"type": "{kind}"}} needs tools: there is no tool to call')
    if kind == "tool":
        if raw.get("name") not in names:
            raise _bad("tool_choice.name", f"names {raw.get('name')!r}, which is not in tools ({', '.join(names)})")
        return {"type": "function", "function": {"name": raw["name"]}}, parallel
    return {"auto": "auto", "any": "required", "none": "none"}[kind], parallel


def to_chat(body: Any) -> dict:
    """The chat-completion body of a Messages request; OpenAIError (400) naming the first bad field."""
    if not isinstance(body, dict):
        raise OpenAIError("The request body must be a JSON object.", code="invalid_request")
    _check_fields(body)
    messages = _messages(body)
    chat: dict[str, Any] = {"model": body["model"], "messages": messages, "max_tokens": body["max_tokens"]}
    if messages[-1]["role"] == "assistant":
        if messages[-1].get("tool_calls"):
            raise _bad("messages", "the last message is the assistant's with tool_use: answer each call with a "
                       "tool_result block in a user message")
        chat["continue_final_message"] = True
    if body.get("tools"):
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        names = [t["function"]["name"] for t in chat.get("tools", ())]
        chat["tool_choice"], parallel = _tool_choice(body["tool_choice"], names)
        if not parallel:
            chat["parallel_tool_calls"] = False
    for key in ("temperature", "top_p", "top_k"):
        if body.get(key) is not None:
            chat[key] = body[key]
    if body.get("stop_sequences"):
        chat["stop"] = list(body["stop_sequences"])
    if body.get("stream"):
        chat["stream"], chat["stream_options"] = True, {"include_usage": True}
    return chat
