"""Request validation for `/v1/chat/completions` and `/v1/completions`, following SGLang's
OpenAI-compatible API (field names and defaults of its ChatCompletionRequest / CompletionRequest),
and the mapping of a validated request to SGLang `sampling_params`.

Every refusal is an `OpenAIError` (HTTP 400) whose `param` names the field as the client wrote it:
an unknown field ("Unrecognized request argument supplied: X"), a field we know but do not
implement set to anything but its default (`UNSUPPORTED`, with what to do instead), a value out of
range. Messages and tools are checked where they are rendered (`render.py`); what the backend
cannot do (the embedded engine's top-k log-probs, repetition penalties) is refused by the backend.

Defaults where SGLang reads the model's generation config: temperature 1.0, top_p 1.0, top_k -1,
min_p 0.0 (OpenAI's). `max_tokens` / `max_completion_tokens` unset = up to the context length
(chat) or 16 (completions), as SGLang. `seed` is used: choice k samples with seed + k.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationError

from agentrl_cli.engines.openai_api.base import OpenAIError

Number = StrictFloat | StrictInt
MAX_TOP_LOGPROBS = 20
EXPECTED = {"stop": "a string or a list of strings", "messages": "a list of message objects",
            "tool_choice": '"none", "auto", "required" or {"type": "function", "function": {"name": ...}}',
            "prompt": "a string, a list of strings, a list of token ids or a list of such lists",
            "tools": 'a list of {"type": "function", "function": {"name": ..., "parameters": {...}}}'}


def _unset(value: Any) -> bool:
    return value is None or value is False or value == {} or value == []


# fields of OpenAI's API we parse but do not implement: refused unless unset (or the default named)
UNSUPPORTED: dict[str, tuple[Any, str]] = {
    "logit_bias": (_unset, "remove it: the server does not bias logits"),
    "functions": (_unset, "send tools instead (functions is OpenAI's deprecated form)"),
    "function_call": (_unset, "send tool_choice instead (function_call is OpenAI's deprecated form)"),
    "response_format": (lambda v: _unset(v) or v == {"type": "text"},
                        'only {"type": "text"} is served (no constrained decoding): ask for JSON in the prompt '
                        "and validate it yourself"),
    "audio": (_unset, "remove it: the server serves text only"),
    "modalities": (lambda v: _unset(v) or v == ["text"], 'remove it or send ["text"]: the server serves text only'),
    "prediction": (_unset, "remove it: predicted outputs are not served"),
    "reasoning_effort": (_unset, "remove it: no reasoning parser is configured"),
    "web_search_options": (_unset, "remove it: the server has no web search"),
    "store": (_unset, "remove it or send false: completions are not stored"),
    "service_tier": (lambda v: v in (None, "auto", "default"), 'remove it or send "auto"'),
    "suffix": (_unset, "remove it: insertion (suffix) is not served"),
    "echo": (_unset, "remove it: the prompt is not echoed back"),
    "best_of": (lambda v: v in (None, 1), "send n instead (best_of other than 1 is not served)"),
    # SGLang extensions (the SGLang router forwards return_hidden_states=false with every request)
    "return_hidden_states": (_unset, "remove it: hidden states are not returned"),
    "lora_path": (_unset, "remove it: this route serves the base weights; a loaded LoRA adapter is served through "
                          "/generate with lora_path"),
    "regex": (_unset, "remove it: no constrained decoding"),
    "ebnf": (_unset, "remove it: no constrained decoding"),
    "json_schema": (_unset, "remove it: no constrained decoding"),
}


class _Loose(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptionsIn(_Loose):
    include_usage: StrictBool = False


class FunctionIn(_Loose):
    name: StrictStr
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None  # accepted; arguments are parsed, not constrained


class ToolIn(_Loose):
    type: Literal["function"] = "function"
    function: FunctionIn


class NamedFunctionIn(_Loose):
    name: StrictStr


class NamedToolChoiceIn(_Loose):
    type: Literal["function"] = "function"
    function: NamedFunctionIn


class _RequestIn(BaseModel):
    """Fields both endpoints take (SGLang's names; its extensions after the OpenAI ones)."""

    model_config = ConfigDict(extra="forbid")
    model: StrictStr | None = None
    max_tokens: StrictInt | None = None
    temperature: Number | None = None
    top_p: Number | None = None
    n: StrictInt = 1
    stop: StrictStr | list[StrictStr] | None = None
    seed: StrictInt | None = None
    stream: StrictBool = False
    stream_options: StreamOptionsIn | None = None
    frequency_penalty: Number | None = None
    presence_penalty: Number | None = None
    user: StrictStr | None = None
    metadata: dict[str, Any] | None = None  # tags only: nothing is stored
    # SGLang extensions
    top_k: StrictInt | None = None
    min_p: Number | None = None
    repetition_penalty: Number | None = None
    stop_token_ids: list[StrictInt] | None = None
    ignore_eos: StrictBool = False
    skip_special_tokens: StrictBool = True
    no_stop_trim: StrictBool = False
    rid: StrictStr | None = None
    # known, not implemented (UNSUPPORTED)
    logit_bias: Any = None
    store: Any = None
    service_tier: Any = None
    return_hidden_states: Any = None
    lora_path: Any = None
    regex: Any = None
    ebnf: Any = None
    json_schema: Any = None


class ChatIn(_RequestIn):
    messages: list[Any]
    max_completion_tokens: StrictInt | None = None
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = None
    tools: list[ToolIn] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoiceIn | None = None
    parallel_tool_calls: StrictBool = True
    chat_template_kwargs: dict[str, Any] | None = None
    continue_final_message: StrictBool = False
    separate_reasoning: StrictBool = True  # no reasoning parser: nothing to separate
    stream_reasoning: StrictBool = True
    functions: Any = None
    function_call: Any = None
    response_format: Any = None
    audio: Any = None
    modalities: Any = None
    prediction: Any = None
    reasoning_effort: Any = None
    web_search_options: Any = None

    @property
    def choice(self) -> str:
        """"none", "auto", "required" or "named" (SGLang: "auto" when tools are given, else "none")."""
        if isinstance(self.tool_choice, NamedToolChoiceIn):
            return "named"
        return self.tool_choice or ("auto" if self.tools else "none")

    @property
    def forced_name(self) -> str | None:
        return self.tool_choice.function.name if isinstance(self.tool_choice, NamedToolChoiceIn) else None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionIn(_RequestIn):
    prompt: StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]
    max_tokens: StrictInt | None = 16
    logprobs: StrictInt | None = None  # a top-k count (0: the sampled tokens' log-probs only)
    suffix: Any = None
    echo: Any = None
    best_of: Any = None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


_TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list", "none"}


def _param(loc: tuple) -> str:
    """A pydantic location as the client wrote it: `tools[0].function.name`."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in _TYPE_TAGS or "[" in part or "-" in part or part[:1].isupper():
            break  # pydantic names a union member here (float, list[str], NamedToolChoiceIn), not a field
        else:
            out += ("." if out else "") + str(part)
    return out


def _validation_error(exc: ValidationError) -> OpenAIError:
    err = exc.errors()[0]
    param = _param(err["loc"]) if err["loc"] else None
    if err["type"] == "extra_forbidden":
        return OpenAIError(f"Unrecognized request argument supplied: {param}. Remove it: this server takes the fields "
                           "of SGLang's OpenAI-compatible API and refuses any other rather than ignore it.",
                           param=param, code="unknown_parameter")
    if err["type"] == "missing":
        return OpenAIError(f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter")
    top = str(err["loc"][0]) if err["loc"] else ""
    expected = EXPECTED.get(top) if param == top else None
    got = err.get("input")
    message = f"Invalid value for '{param}': expected {expected}, got {got!r}." if expected else \
        f"Invalid value for '{param}': {err['msg']} (got {got!r})."
    return OpenAIError(message, param=param, code="invalid_value")


def _parse(cls, body: Any):
    if not isinstance(body, dict):
        raise OpenAIError("The request body must be a JSON object.", code="invalid_request")
    try:
        req = cls.model_validate(body)
    except ValidationError as exc:
        raise _validation_error(exc) from None
    for name, (ok, hint) in UNSUPPORTED.items():
        if name in cls.model_fields and not ok(getattr(req, name)):
            raise OpenAIError(f"{name}={getattr(req, name)!r} is not supported by this server: {hint}.",
                              param=name, code="unsupported_parameter")
    _check_ranges(req)
    return req


def _bad(param: str, rule: str) -> OpenAIError:
    return OpenAIError(f"Invalid value for '{param}': {rule}.", param=param, code="invalid_value")


def _check_ranges(req: _RequestIn) -> None:
    numbers = {k: getattr(req, k) for k in ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty",
                                            "repetition_penalty") if getattr(req, k) is not None}
    for key, value in numbers.items():
        if not math.isfinite(value):
            raise _bad(key, "must be a finite number")
    rules = [
        ("temperature", req.temperature is None or req.temperature >= 0, "must be at least 0 (0 is greedy)"),
        ("top_p", req.top_p is None or 0 < req.top_p <= 1, "must be in (0, 1]"),
        ("top_k", req.top_k is None or req.top_k == -1 or req.top_k >= 1, "must be -1 (off) or at least 1"),
        ("min_p", req.min_p is None or 0 <= req.min_p <= 1, "must be in [0, 1]"),
        ("frequency_penalty", req.frequency_penalty is None or -2 <= req.frequency_penalty <= 2, "must be in [-2, 2]"),
        ("presence_penalty", req.presence_penalty is None or -2 <= req.presence_penalty <= 2, "must be in [-2, 2]"),
        ("repetition_penalty", req.repetition_penalty is None or 0 <= req.repetition_penalty <= 2, "must be in [0, 2]"),
        ("n", req.n >= 1, "must be at least 1"),
        ("max_tokens", req.max_tokens is None or req.max_tokens >= 1, "must be at least 1"),
        ("stop", not isinstance(req.stop, list) or all(req.stop), "must not contain empty strings"),
        ("stop", req.stop != "", "must not be an empty string"),
    ]
    if isinstance(req, ChatIn):
        rules += [
            ("max_completion_tokens", req.max_completion_tokens is None or req.max_completion_tokens >= 1,
             "must be at least 1"),
            ("top_logprobs", req.top_logprobs is None or 0 <= req.top_logprobs <= MAX_TOP_LOGPROBS,
             f"must be in [0, {MAX_TOP_LOGPROBS}]"),
            ("top_logprobs", not req.top_logprobs or req.logprobs, "needs logprobs: true"),
            ("messages", bool(req.messages), "must not be empty"),
            ("tool_choice", req.choice not in ("required", "named") or bool(req.tools),
             "needs tools: there is no tool to call"),
            ("tool_choice", req.forced_name is None or any(t.function.name == req.forced_name for t in req.tools or ()),
             f"names {req.forced_name!r}, which is not in tools"),
        ]
    else:
        rules += [("logprobs", req.logprobs is None or 0 <= req.logprobs <= MAX_TOP_LOGPROBS,
                   f"must be in [0, {MAX_TOP_LOGPROBS}]"),
                  ("prompt", req.prompt not in ("", []) and (isinstance(req.prompt, str) or
                                                              all(p not in ("", []) for p in req.prompt)),
                   "must not be empty")]
    for param, ok, rule in rules:
        if not ok:
            raise _bad(param, rule)


def parse_chat(body: Any) -> ChatIn:
    """A validated `/v1/chat/completions` body (messages and tools are checked when rendered)."""
    return _parse(ChatIn, body)


def parse_completion(body: Any) -> CompletionIn:
    """A validated `/v1/completions` body."""
    return _parse(CompletionIn, body)


def sampling_params(req: _RequestIn, stop_token_ids: list[int] = (), *, max_tokens: int | None = None) -> dict:
    """SGLang `sampling_params` for one choice of `req` (`n` and seeds per choice are the backend's).
    `stop_token_ids`: the chat format's end-of-turn and eos ids, added to the request's own."""
    sampling: dict[str, Any] = {
        "max_new_tokens": max_tokens,
        "temperature": 1.0 if req.temperature is None else float(req.temperature),
        "top_p": 1.0 if req.top_p is None else float(req.top_p),
        "top_k": -1 if req.top_k is None else req.top_k,
        "min_p": 0.0 if req.min_p is None else float(req.min_p),
        "frequency_penalty": float(req.frequency_penalty or 0.0),
        "presence_penalty": float(req.presence_penalty or 0.0),
    }
    if req.repetition_penalty not in (None, 1, 1.0):
        sampling["repetition_penalty"] = float(req.repetition_penalty)
    if req.stop:
        sampling["stop"] = [req.stop] if isinstance(req.stop, str) else list(req.stop)
    stops = [*(req.stop_token_ids or ()), *(i for i in stop_token_ids if i not in (req.stop_token_ids or ()))]
    if stops:
        sampling["stop_token_ids"] = stops
    if req.ignore_eos:
        sampling["ignore_eos"] = True
    if req.seed is not None:
        sampling["sampling_seed"] = req.seed
    return sampling
