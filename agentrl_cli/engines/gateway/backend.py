"""The gateway's `openai_api.Backend`: tokens from the run's inference servers through the run's
`InferenceClient` (its router policy, retries, API key and deadlines), over SGLang's `/generate`
with `input_ids`, so the embedded server and SGLang serve a gateway alike. Each choice is one
`rollout.resume.generate_resumable` turn: a generation the server aborts (a weight update) or loses
continues from its partial ids, as the rollout's own turns do, and its weight version is the oldest
that produced any of its tokens.

Streamed calls (`generate_stream`) read SGLang's `/generate` stream, so the tokens reach the agent
as the server samples them; a stream the server aborts goes on from its partial ids on a new
stream (the tokens already sent stay: `rollout.allow_partial_resume` cannot apply), a server lost
mid-stream fails the call (503; the stream ends, nothing is recorded), and closing the stream (the
agent went away) closes the server's and asks it to abort the request.

`CallBackend` is the view of one chat call: it takes the ids the chat template rendered, lets the
session choose the ids to generate from (`splice.plan_call`), and keeps both for the recorder.

Not here: rendering and parsing chat messages (`openai_api`), choosing the ids (`splice.py`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections import Counter
from typing import Any, AsyncIterator, Awaitable, Callable

from agentrl_cli.engines.inference.awaiting import Stream
from agentrl_cli.engines.inference.client import InferenceClient, InferenceError, InferenceUnreachable, SamplingParams
from agentrl_cli.engines.openai_api import Completion, OpenAIError
from agentrl_cli.engines.openai_api.base import TokenChunk
from agentrl_cli.engines.resume import GenerationLost, ResumePolicy, version_key, generate_resumable

# sampling_params keys the client's SamplingParams carries, and the rest at the values that leave sampling alone
CARRIED = {"max_new_tokens", "temperature", "top_p", "top_k", "stop", "stop_token_ids", "sampling_seed", "seed",
           "ignore_eos"}
NEUTRAL = {"min_p": 0.0, "frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0,
           "min_new_tokens": 0, "n": 1, "skip_special_tokens": None, "no_stop_trim": None,
           "spaces_between_special_tokens": None, "stream_interval": None}


def sampling_params(sampling: dict, prompt_len: int, context_length: int | None) -> SamplingParams:
    """`sampling` (SGLang's sampling_params form) as the client's SamplingParams; OpenAIError 400 naming
    a setting the client cannot send. No max_new_tokens means up to the context length."""
    for key, value in sampling.items():
        if key in CARRIED or value is None:
            continue
        if key not in NEUTRAL:
            raise OpenAIError(f"{key} is not supported through the gateway (the inference client sends "
                              f"{', '.join(sorted(CARRIED - {'seed'}))}); leave it unset", param=key)
        if NEUTRAL[key] is not None and value != NEUTRAL[key]:
            raise OpenAIError(f"{key}={value!r} is not supported through the gateway; leave it at {NEUTRAL[key]!r}",
                              param=key)
    room = None if context_length is None else context_length - prompt_len
    if room is not None and room <= 0:
        raise OpenAIError(f"the prompt has {prompt_len} tokens, the model's context is {context_length}: shorten the "
                          "conversation", param="messages", code="context_length_exceeded")
    limit = sampling.get("max_new_tokens")
    if limit is None and room is None:
        raise OpenAIError("max_tokens is required here (the gateway was not told the model's context length)",
                          param="max_tokens")
    stop = sampling.get("stop")
    seed = sampling.get("sampling_seed", sampling.get("seed"))
    return SamplingParams(max_new_tokens=int(min(x for x in (limit, room) if x is not None)),
                          temperature=float(sampling.get("temperature", 1.0)), top_p=float(sampling.get("top_p", 1.0)),
                          top_k=int(sampling.get("top_k", -1)), stop=[stop] if isinstance(stop, str) else stop or None,
                          stop_token_ids=list(sampling.get("stop_token_ids") or []) or None,
                          seed=None if seed is None else int(seed), ignore_eos=bool(sampling.get("ignore_eos", False)))


class ClientBackend:
    """Backend over an InferenceClient. `context_length`: the served model's (bounds max_new_tokens);
    `on_recovered`: awaited after a lost server answers again (the run re-syncs weights there)."""

    def __init__(self, client: InferenceClient, tokenizer, *, model_name: str = "default",
                 context_length: int | None = None, resume: ResumePolicy | None = None,
                 on_recovered: Callable[[], Awaitable[None]] | None = None) -> None:
        self.client, self.tokenizer, self._name = client, tokenizer, model_name
        self.context_length, self.resume, self.on_recovered = context_length, resume or ResumePolicy(), on_recovered
        self.counters: Counter = Counter()  # rollout.resume.COUNTERS over every call

    def model_name(self) -> str:
        return self._name

    async def aclose(self) -> None:
        """Close the client's connections (on the event loop that served the calls)."""
        await self.client.close()

    @property
    def streams(self) -> bool:
        """Whether calls can be streamed as generated: the servers' generate route streams."""
        return self.client.streams

    @staticmethod
    def _no_top_logprobs(top_logprobs: int) -> None:
        if top_logprobs:
            raise OpenAIError("top_logprobs is not available through the gateway (SGLang's /generate path it uses "
                              "returns the sampled tokens' log-probs only); ask for logprobs without top_logprobs",
                              param="top_logprobs")

    async def generate(self, input_ids: list[int], sampling: dict, *, n: int = 1, top_logprobs: int = 0) -> list[Completion]:
        self._no_top_logprobs(top_logprobs)
        params = sampling_params(sampling, len(input_ids), self.context_length)

        async def one(k: int) -> Completion:
            p = params if params.seed is None or k == 0 else dataclasses.replace(params, seed=params.seed + k)
            gen = await generate_resumable(self.client, input_ids, p, self.resume, self.counters,
                                           on_recovered=self.on_recovered)
            return Completion(output_ids=list(gen.output_ids), output_logprobs=list(gen.output_logprobs),
                              finish_reason=gen.finish_reason, matched_stop=self._matched(gen.output_ids, gen.finish_reason, p),
                              weight_version=str(gen.weight_version))
        try:
            return list(await asyncio.gather(*(one(k) for k in range(n))))
        except GenerationLost as exc:
            raise OpenAIError(f"the inference servers did not complete the generation: {exc.message}", status=503,
                              type="server_error") from None
        except InferenceError as exc:
            raise OpenAIError(f"the inference server refused the request: {exc.message}") from None

    async def generate_stream(self, input_ids: list[int], sampling: dict, *,
                              top_logprobs: int = 0) -> AsyncIterator[TokenChunk]:
        self._no_top_logprobs(top_logprobs)
        params = sampling_params(sampling, len(input_ids), self.context_length)
        tokens = await self._open_stream(list(input_ids), params)
        return Stream(self._streamed(list(input_ids), params, tokens), tokens.aclose)

    async def _open_stream(self, input_ids: list[int], params: SamplingParams):
        try:
            return await self.client.generate_stream(input_ids, params, uuid.uuid4().hex)
        except InferenceUnreachable as exc:
            raise OpenAIError(f"no inference server answered: {exc.message}", status=503, type="server_error") from None
        except InferenceError as exc:
            raise OpenAIError(f"the inference server refused the request: {exc.message}") from None

    async def _streamed(self, prompt: list[int], params: SamplingParams, tokens) -> AsyncIterator[TokenChunk]:
        """The tokens as the server sends them; a generation the server aborts (a weight update) goes on
        from its partial ids on a new stream, as `generate_resumable` does (the tokens sent stay)."""
        ids: list[int] = []
        logprobs: list[float] = []
        versions: list[str] = []
        attempts = 0
        try:
            while True:
                last = None
                async for new, new_lp, version, final in tokens:
                    ids += new
                    logprobs += new_lp
                    if new:
                        versions.append(version)
                    if new or final is None:
                        yield TokenChunk(new, new_lp, version)
                    last = final
                remaining = params.max_new_tokens - len(ids)
                stopped = bool(ids) and ids[-1] in (params.stop_token_ids or ())
                if last is not None and last.aborted and remaining > 0 and not stopped \
                        and attempts < self.resume.max_attempts:
                    attempts += 1
                    self.counters["aborted_generations"] += 1
                    self.counters["resumed_generations"] += bool(ids)
                    await tokens.aclose()
                    tokens = await self._open_stream(prompt + ids, dataclasses.replace(params, max_new_tokens=remaining))
                    continue
                finish = last.finish_reason if last is not None else "abort"
                if last is not None and last.aborted and (remaining <= 0 or stopped):
                    finish = "length" if remaining <= 0 else "stop"
                version = min(versions, key=version_key) if versions else (last.weight_version if last else "")
                yield TokenChunk([], [], version, Completion(output_ids=ids, output_logprobs=logprobs, finish_reason=finish,
                                                             matched_stop=self._matched(ids, finish, params),
                                                             weight_version=str(version)))
                return
        except InferenceError as exc:
            raise OpenAIError(f"the inference server failed mid-stream: {exc.message}", status=503,
                              type="server_error") from None
        finally:
            await tokens.aclose()

    def _matched(self, ids: list[int], finish: str, p: SamplingParams) -> int | str | None:
        """SGLang's matched_stop: the stop token or stop string that ended a "stop" generation."""
        if finish != "stop" or not ids:
            return None
        if ids[-1] in (p.stop_token_ids or []) or ids[-1] == getattr(self.tokenizer, "eos_token_id", None):
            return ids[-1]
        text = self.tokenizer.decode(ids)
        return next((s for s in p.stop or [] if text.endswith(s)), None)


class CallBackend:
    """One chat call's view of a Backend: `choose(rendered_ids)` picks the ids generated from;
    `rendered` and `sent` keep both for the recorder (None until the call generated)."""

    def __init__(self, inner, choose: Callable[[list[int]], list[int]]) -> None:
        self.inner, self.choose, self.tokenizer = inner, choose, inner.tokenizer
        self.rendered: list[int] | None = None
        self.sent: list[int] | None = None
        self.streams = bool(getattr(inner, "streams", False))

    def model_name(self) -> str:
        return self.inner.model_name()

    async def generate(self, input_ids: list[int], sampling: dict, *, n: int = 1, top_logprobs: int = 0) -> list[Completion]:
        self._choose(input_ids)
        return await self.inner.generate(self.sent, sampling, n=n, top_logprobs=top_logprobs)

    async def generate_stream(self, input_ids: list[int], sampling: dict, *,
                              top_logprobs: int = 0) -> AsyncIterator[TokenChunk]:
        self._choose(input_ids)
        return await self.inner.generate_stream(self.sent, sampling, top_logprobs=top_logprobs)

    def _choose(self, input_ids: list[int]) -> None:
        if self.sent is not None:
            raise RuntimeError("a gateway call generated twice; each chat call must generate once")
        self.rendered = list(input_ids)
        self.sent = list(self.choose(self.rendered))


def config_urls(config) -> list[str]:
    """The inference servers a run's config names: `inference.urls`, else the ports clients use of
    those a run starts (`inference.port` onwards; the router's after them when the engine puts one
    in front of the replicas)."""
    from agentrl_cli.engines.registry import engine_for

    inf = config.inference
    if inf.urls:
        return [u.rstrip("/") for u in inf.urls]
    host = {"0.0.0.0": "127.0.0.1", "::": "[::1]"}.get(inf.host, f"[{inf.host}]" if ":" in inf.host else inf.host)
    return [f"http://{host}:{port}" for use in engine_for(config).ports(inf) if use.serves_clients
            for port in range(use.first, use.last + 1)]


def describe(backend: Any) -> dict:
    """What /health reports of a backend."""
    client = getattr(backend, "client", None)
    return {"model": backend.model_name(), "inference_urls": list(getattr(client, "urls", []))}


def backend_from_config(config, urls: list[str], model: str = "") -> ClientBackend:
    """The Backend a run's config describes: its client (`inference.api_key`, timeouts, retries, router
    policy) over `urls`, the model's tokenizer (`model` or `model.path`), its context length, and the
    rollout's resume policy."""
    from transformers import AutoTokenizer

    from agentrl_cli.engines.inference.client import client_from_config
    from agentrl_cli.model.resolve import resolve_model_path

    path = resolve_model_path(model or config.model.path, config.model.cache_dir)
    return ClientBackend(client_from_config(config, urls), AutoTokenizer.from_pretrained(str(path)),
                         model_name=model or config.model.path, context_length=config.model.context_length,
                         resume=ResumePolicy.from_config(config))
