"""The seam of the OpenAI-compatible API: what serves the tokens (`Backend`), one generated choice
exactly as served (`Completion`) and the tokens of a streamed one as they come (`TokenChunk`), one chat call token-exact (`ChatCall`, what a recording gateway
keeps) and the error every layer raises (`OpenAIError`, written as OpenAI's error object).

Types only. Validation is `protocol.py`, prompts `render.py`, tool-call parsing `parse.py`,
response objects `responses.py`, the calls themselves `service.py`, HTTP `routes.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class Completion:
    """One generated choice, exactly as served: the ids include the stop token that ended it."""

    output_ids: list[int]
    output_logprobs: list[float]
    finish_reason: str  # "stop" | "length" | "abort"
    matched_stop: int | str | None = None
    weight_version: str = ""
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)  # per token, when asked
    cached_tokens: int = 0  # prompt tokens served from the prefix cache


@dataclass
class TokenChunk:
    """Tokens of a streamed choice as they were generated (`Backend.generate_stream`); the last chunk
    carries the whole choice (`done`), whose ids are every chunk's ids in order."""

    ids: list[int]
    logprobs: list[float]
    weight_version: str = ""
    done: Completion | None = None


class Backend(Protocol):
    """What serves the tokens: the embedded engine (`engine_backend.EngineBackend`) or a client of
    SGLang-protocol servers. `sampling` is in SGLang's `sampling_params` form (max_new_tokens,
    temperature, top_p, top_k, min_p, penalties, stop, stop_token_ids, ignore_eos, sampling_seed);
    `n` samples of one prompt share a batch; log-probs are always returned. Raise `OpenAIError`
    for what the client must fix (400) and for a backend that cannot serve now (503).

    Optional: a backend with `streams = True` also has `generate_stream` (one choice): awaiting it
    validates and submits the request (raising as `generate` does), and the iterator it returns
    yields `TokenChunk`s as the tokens are generated; closing the iterator early (the client went
    away) aborts the generation. Without it a streamed call is generated whole, then written."""

    tokenizer: Any  # a transformers tokenizer carrying the model's chat template

    def model_name(self) -> str: ...

    async def generate(self, input_ids: list[int], sampling: dict, *, n: int = 1,
                       top_logprobs: int = 0) -> list[Completion]: ...

    # optional, with `streams = True`:
    # async def generate_stream(self, input_ids, sampling, *, top_logprobs=0) -> AsyncIterator[TokenChunk]: ...


@dataclass
class ChatCall:
    """One `/v1/chat/completions` call, token-exact: the ids the model was fed (`prompt_ids`, with any
    assistant prefix the call forced or continued) and the choices it generated, beside the OpenAI
    response object the client received."""

    request: dict  # the request body as sent
    prompt_ids: list[int]
    choices: list[Completion]
    response: dict  # the chat.completion object
    messages: list[dict]
    tools: list[dict] | None
    prefix: str = ""  # text of the assistant turn already in the prompt (continued or forced)
    deltas: list | None = None  # per choice, the streamed content as (text, log-prob entries); set when streamed
    rejected: list[list[str]] = field(default_factory=list)  # per choice, why each tool call the model wrote was refused (parse.py)


class OpenAIError(Exception):
    """A refusal written as OpenAI's error object (`body()`); `param` names the offending field the
    way the client wrote it (`messages[2].role`, `logit_bias`)."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400,
                 type: str = "invalid_request_error", code: str | None = None) -> None:
        super().__init__(message)
        self.message, self.param, self.status, self.type, self.code = message, param, status, type, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
