"""The `Backend` over the embedded engine (`agentrl_cli.engines.inference.engine.HFEngine`): a chat call's
`n` choices are `n` requests submitted together (`submit_many`), so they join the same continuous
batches and prefix cache as `/generate`, validated by `/generate`'s own rules
(`inference.protocol.parse_generate`: sampling ranges, vocabulary, context length, the sampling
keys the engine honours). What the engine cannot do is refused with the OpenAI field's name:
top-k log-probs (the engine returns the sampled token's only) and repetition penalties.

Streamed (`generate_stream`): the engine hands each token to the event loop as its decode step
samples it (`inference.awaiting.stream_request`); closing the stream aborts the request.
"""

from __future__ import annotations

import re
from typing import AsyncIterator, Callable

from agentrl_cli.engines.inference.awaiting import Stream, await_results, stream_request
from agentrl_cli.engines.inference.protocol import ProtocolError, parse_generate
from agentrl_cli.engines.openai_api.base import Completion, OpenAIError, TokenChunk

# /generate's sampling_params names -> the OpenAI request's names
_FIELD = {"max_new_tokens": "max_tokens", "sampling_seed": "seed"}


def _refusal(exc: ProtocolError) -> OpenAIError:
    found = re.search(r"sampling_params\.(\w+)", str(exc))
    param = _FIELD.get(found.group(1), found.group(1)) if found else None
    message = str(exc).replace("sampling_params.", "")
    code = "context_length_exceeded" if "context length" in message else "invalid_value"
    return OpenAIError(message, param=param, code=code)


class EngineBackend:
    """Serves OpenAI calls with an `HFEngine`; `model_name` as the server reports it (`/v1/models`)."""

    streams = True  # `generate_stream`: tokens as the engine samples them

    def __init__(self, engine, model_name: Callable[[], str] | None = None) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self._model_name = model_name or (lambda: engine.model_path)

    def model_name(self) -> str:
        return self._model_name()

    @property
    def context_length(self) -> int:
        return self.engine.context_length

    def _parsed(self, input_ids: list[int], sampling: dict, n: int, top_logprobs: int):
        if top_logprobs:
            raise OpenAIError("top_logprobs > 0 is not supported by the embedded server: its engine returns the sampled "
                              "token's log-prob only; send top_logprobs 0 (logprobs: true still returns every token's "
                              "log-prob)", param="top_logprobs", code="unsupported_parameter")
        engine = self.engine
        body = {"input_ids": input_ids, "sampling_params": {**sampling, "n": n}, "return_logprob": True}
        try:
            return parse_generate(body, engine.tokenizer, engine.vocab_size, engine.context_length)
        except ProtocolError as exc:
            raise _refusal(exc) from None

    def _submitting(self, submit):
        try:
            return submit()
        except ProtocolError as exc:
            raise _refusal(exc) from None
        except ValueError as exc:
            raise _refusal(ProtocolError(str(exc))) from None
        except RuntimeError as exc:  # the engine is closed
            raise OpenAIError(f"the inference engine is not serving: {exc}", status=503, type="server_error") from None

    async def generate(self, input_ids: list[int], sampling: dict, *, n: int = 1,
                       top_logprobs: int = 0) -> list[Completion]:
        parsed = self._parsed(input_ids, sampling, n, top_logprobs)
        futures = self._submitting(lambda: self.engine.submit_many([
            dict(input_ids=i.input_ids, sampling=i.sampling, rid=i.rid, return_logprob=True) for i in parsed.items]))
        results = await await_results(self.engine, futures, [i.rid for i in parsed.items])
        return [_completion(r) for r in results]

    async def generate_stream(self, input_ids: list[int], sampling: dict, *,
                              top_logprobs: int = 0) -> AsyncIterator[TokenChunk]:
        (item,) = self._parsed(input_ids, sampling, 1, top_logprobs).items
        tokens = self._submitting(lambda: stream_request(self.engine, dict(
            input_ids=item.input_ids, sampling=item.sampling, rid=item.rid, return_logprob=True)))
        return Stream(_chunks(tokens), tokens.aclose)


async def _chunks(tokens) -> AsyncIterator[TokenChunk]:
    try:
        async for ids, logprobs, version, result in tokens:
            yield TokenChunk(ids, logprobs, version, None if result is None else _completion(result))
    finally:
        await tokens.aclose()


def _completion(result: dict) -> Completion:
    reason = result["finish_reason"]
    return Completion(output_ids=list(result["output_ids"]), output_logprobs=list(result["output_logprobs"]),
                      finish_reason=reason["type"], matched_stop=reason.get("matched"),
                      weight_version=result["weight_version"], cached_tokens=result.get("cached_tokens", 0))
