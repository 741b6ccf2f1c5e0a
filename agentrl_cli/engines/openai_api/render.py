"""OpenAI chat messages and tools -> the prompt's token ids, with the model's own chat template
(`agentrl_cli.model.chat`: tools natively or by the documented fallback, tool results as the
template knows them).

Messages: `system`, `developer` (rendered as system), `user`, `assistant` (content and/or
`tool_calls`, whose JSON-string `arguments` are handed to the template as objects, as SGLang does)
and `tool`. Content is a string or a list of text parts (joined with newlines). A template that
does not render an assistant's `tool_calls` gets them written into the content as Hermes
`<tool_call>` blocks, so a conversation never loses a call it made.

The assistant turn may start inside the prompt (`Rendered.prefix`): the client's own text with
`continue_final_message` (SGLang's prefill), then the opening of a tool call the server writes for
`tool_choice: "required"` (`<tool_call>\\n`) or a named function (`<tool_call>\\n{"name": "f",
"arguments": `). The embedded engine cannot constrain decoding, so a forced call is opened for the
model, not guaranteed to be well formed; `parse.py` reads the turn from its start. With
`tool_choice: "none"` the template sees no tools; with a named function, only that one (SGLang).

Nothing here generates or builds responses.
"""

from __future__ import annotations

import json
import weakref
from dataclasses import dataclass

from agentrl_cli.model.chat import chat_format, prepare
from agentrl_cli.engines.openai_api.base import OpenAIError
from agentrl_cli.engines.openai_api.protocol import ChatIn

ROLES = ("system", "developer", "user", "assistant", "tool")
_PROBE_NAME = "agentrl_probe_call_3e9b"
_RENDERS_CALLS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


@dataclass
class Rendered:
    prompt_ids: list[int]
    prefix: str  # the assistant turn's text already in the prompt: the client's, then the forced opening
    client_prefix: str  # the part the client wrote (continue_final_message); not echoed back as content
    stop_ids: list[int]  # the template's end of turn and the model's eos ids
    tools: list[dict] | None  # the tools the template was given (and the calls may name)
    messages: list[dict]  # the messages as handed to the template


def hermes_block(name: str, arguments) -> str:
    """One call in the Hermes convention, as the built-in template writes it."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "\n</tool_call>"


def forced_opening(req: ChatIn) -> str:
    """The opening of the tool call the server writes for `required` / a named function."""
    if req.choice == "named":
        return '<tool_call>\n{"name": ' + json.dumps(req.forced_name, ensure_ascii=False) + ', "arguments": '
    return "<tool_call>\n" if req.choice == "required" else ""


def _text(content, where: str, *, optional: bool) -> str:
    if content is None and optional:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if isinstance(part, str):
                texts.append(part)
            elif kind == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            else:
                raise OpenAIError(f"{where}[{j}]: content part of type {kind!r} is not supported: the model reads text "
                                  'only; send {"type": "text", "text": "..."} parts or a string',
                                  param=f"{where}[{j}].type", code="unsupported_parameter")
        return "\n".join(texts)
    raise OpenAIError(f"{where}: expected a string or a list of text parts, got {content!r}.", param=where,
                      code="invalid_value")


def _tool_call(call, where: str) -> dict:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise OpenAIError(f'{where}: expected {{"type": "function", "function": {{"name": ..., "arguments": "..."}}}}, '
                          f"got {call!r}.", param=where, code="invalid_value")
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError as exc:
            raise OpenAIError(f"{where}.function.arguments is not valid JSON ({exc}); send the arguments object "
                              "as a JSON string", param=f"{where}.function.arguments", code="invalid_value") from None
    if not isinstance(args, dict):
        raise OpenAIError(f"{where}.function.arguments must be a JSON object, got {args!r}.",
                          param=f"{where}.function.arguments", code="invalid_value")
    out = {"type": "function", "function": {"name": fn["name"], "arguments": args}}
    if isinstance(call.get("id"), str):
        out["id"] = call["id"]
    return out


def normalize_messages(raw: list) -> list[dict]:
    """The messages as the template takes them; an OpenAIError names the first bad one."""
    out = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise OpenAIError(f"{where}: expected a message object, got {m!r}.", param=where, code="invalid_value")
        role = m.get("role")
        if role not in ROLES:
            hint = " (send tool results as role 'tool')" if role == "function" else ""
            raise OpenAIError(f"{where}.role: expected one of {', '.join(ROLES)}, got {role!r}{hint}.",
                              param=f"{where}.role", code="invalid_value")
        is_assistant = role == "assistant"
        if not is_assistant and "content" not in m:
            raise OpenAIError(f"Missing required parameter: '{where}.content'.", param=f"{where}.content",
                              code="missing_required_parameter")
        msg = {"role": "system" if role == "developer" else role,
               "content": _text(m.get("content"), f"{where}.content", optional=is_assistant)}
        calls = m.get("tool_calls") if is_assistant else None
        if calls:
            if not isinstance(calls, list):
                raise OpenAIError(f"{where}.tool_calls: expected a list, got {calls!r}.", param=f"{where}.tool_calls",
                                  code="invalid_value")
            msg["tool_calls"] = [_tool_call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(calls)]
        for key in ("name", "tool_call_id"):
            if isinstance(m.get(key), str):
                msg[key] = m[key]
        out.append(msg)
    return out


def renders_tool_calls(tokenizer) -> bool:
    """Whether the template writes an assistant message's `tool_calls` (cached per tokenizer)."""
    try:
        return _RENDERS_CALLS[tokenizer]
    except (KeyError, TypeError):
        pass
    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"type": "function", "function": {"name": _PROBE_NAME, "arguments": {}}}]}]
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
        found = _PROBE_NAME in text
    except Exception:  # noqa: BLE001 - a template that raises on tool_calls does not render them
        found = False
    try:
        _RENDERS_CALLS[tokenizer] = found
    except TypeError:
        pass
    return found


def _fold_calls(messages: list[dict]) -> list[dict]:
    """Assistant tool_calls written into the content, for templates that ignore them."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            blocks = "\n".join(hermes_block(c["function"]["name"], c["function"]["arguments"]) for c in m["tool_calls"])
            m = {k: v for k, v in m.items() if k != "tool_calls"}
            m["content"] = (m["content"] + "\n" if m["content"] else "") + blocks
        out.append(m)
    return out


def template_tools(req: ChatIn) -> list[dict] | None:
    """The tools the template sees: none for tool_choice "none", only the named one when named."""
    if not req.tools or req.choice == "none":
        return None
    tools = [t.model_dump(exclude_none=True) for t in req.tools]
    if req.forced_name is not None:
        tools = [t for t in tools if t["function"]["name"] == req.forced_name]
    return tools


def _apply(tokenizer, messages: list[dict], tools: list[dict] | None, kwargs: dict) -> str:
    """The template's text; a template that fails on OpenAI-wrapped tools is given the bare functions
    (SGLang's second try, for Mistral-style templates)."""
    def apply(given):
        return tokenizer.apply_chat_template(messages, tools=given, tokenize=False, add_generation_prompt=True, **kwargs)

    try:
        return apply(tools)
    except Exception as exc:  # noqa: BLE001 - jinja's raise_exception, a missing variable: the request's to fix
        refusal = OpenAIError(f"the model's chat template refused these messages: {type(exc).__name__}: {exc}",
                              param="messages", code="invalid_value")
    if tools:
        try:
            return apply([t["function"] for t in tools])
        except Exception:  # noqa: BLE001 - the first failure is the one to report
            pass
    raise refusal


def render_chat(tokenizer, req: ChatIn) -> Rendered:
    """The prompt of a validated chat request under the model's chat template."""
    messages = normalize_messages(req.messages)
    client_prefix = ""
    if req.continue_final_message:
        last = messages[-1]
        if last["role"] != "assistant" or last.get("tool_calls"):
            raise OpenAIError("continue_final_message needs the last message to be the assistant's, with text content "
                              "only (the text the reply continues).", param="continue_final_message",
                              code="invalid_value")
        client_prefix, messages = last["content"], messages[:-1]
    try:
        fmt = chat_format(tokenizer)
    except ValueError as exc:
        raise OpenAIError(f"the model cannot serve chat completions: {exc}", status=500, type="server_error") from None
    tools = template_tools(req)
    shown = messages if renders_tool_calls(tokenizer) else _fold_calls(messages)
    msgs, native_tools = prepare(fmt, shown, tools)
    text = _apply(tokenizer, msgs, native_tools, req.chat_template_kwargs or {})
    prefix = client_prefix + forced_opening(req)
    ids = tokenizer.encode(text + prefix, add_special_tokens=False)
    return Rendered(ids, prefix, client_prefix, list(fmt.stop_ids), tools, msgs)
