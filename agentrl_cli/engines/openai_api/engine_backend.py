"""The `Backend` over the embedded engine (`agentrl_cli.engines.inference.engine.HFEngine`): a chat call's
`n` choices are `n` requests submitted together (`submit_many`), so they join the same continuous
batches and prefix cache as `/generate`, validated by `/generate`'s own rules
(`inference.protocol.parse_generate`: sampling ranges, vocabulary, context length, the sampling
keys the engine honours). What the engine cannot do is refused with the OpenAI field's name:
top-k log-probs (the engine returns the sampled token's only) and repetition penalties.
"""

from __future__ import annotations

import re
from typing import Callable

from agentrl_cli.engines.inference.awaiting import await_results
from agentrl_cli.engines.inference.protocol import ProtocolError, parse_generate
from agentrl_cli.engines.openai_api.base import Completion, OpenAIError

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

    def __init__(self, engine, model_name: Callable[[], str] | None = None) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self._model_name = model_name or (lambda: engine.model_path)

    def model_name(self) -> str:
        return self._model_name()

    @property
    def context_length(self) -> int:
        return self.engine.context_length

    async def generate(self, input_ids: list[int], sampling: dict, *, n: int = 1,
                       top_logprobs: int = 0) -> list[Completion]:
        if top_logprobs:
            raise OpenAIError("top_logprobs > 0 is not supported by the embedded server: its engine returns the sampled "
                              "token's log-prob only; send top_logprobs 0 (logprobs: true still returns every token's "
                              "log-prob)", param="top_logprobs", code="unsupported_parameter")
        engine = self.engine
        body = {"input_ids": input_ids, "sampling_params": {**sampling, "n": n}, "return_logprob": True}
        try:
            parsed = parse_generate(body, engine.tokenizer, engine.vocab_size, engine.context_length)
            futures = engine.submit_many([dict(input_ids=i.input_ids, sampling=i.sampling, rid=i.rid,
                                               return_logprob=True) for i in parsed.items])
        except ProtocolError as exc:
            raise _refusal(exc) from None
        except ValueError as exc:
            raise _refusal(ProtocolError(str(exc))) from None
        except RuntimeError as exc:  # the engine is closed
            raise OpenAIError(f"the inference engine is not serving: {exc}", status=503, type="server_error") from None
        results = await await_results(engine, futures, [i.rid for i in parsed.items])
        return [_completion(r) for r in results]


def _completion(result: dict) -> Completion:
    reason = result["finish_reason"]
    return Completion(output_ids=list(result["output_ids"]), output_logprobs=list(result["output_logprobs"]),
                      finish_reason=reason["type"], matched_stop=reason.get("matched"),
                      weight_version=result["weight_version"], cached_tokens=result.get("cached_tokens", 0))
