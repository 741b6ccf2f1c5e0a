"""The calls themselves: a chat completion (validate, render with the model's template, generate
the `n` choices in one go, parse tool calls, build the response), a text completion, and their
server-sent-event streams.

Streams: a streamed call with one choice on a backend that streams (`Backend.streams`: the
embedded engine, the gateway's client of SGLang-protocol servers) is written as its tokens are
generated (`live.py`). Otherwise (`n` > 1, a backend that returns complete choices) the stream is
written once the choices are generated (`chat_stream`): a role chunk, the content one token's text
at a time with that token's log-prob, the tool calls, a finish chunk per choice, the usage chunk
when `stream_options.include_usage`, then `[DONE]`. Either way the concatenated deltas equal the
non-streamed message (text cut at a stop string is cut in the stream too). A turn whose content
is not its tokens' text in order (parsed tool calls cut out, a forced tool-call opening) sends
that content in one delta once it is known. Errors found before generating are HTTP errors, never
a stream.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import AsyncIterator

from agentrl_cli.engines.inference.protocol import output_text
from agentrl_cli.engines.openai_api.base import Backend, ChatCall, Completion, OpenAIError
from agentrl_cli.engines.openai_api.parse import parse_turn
from agentrl_cli.engines.openai_api.protocol import ChatIn, CompletionIn, parse_chat, parse_completion, sampling_params
from agentrl_cli.engines.openai_api.render import Rendered, render_chat
from agentrl_cli.engines.openai_api.responses import (DONE, chat_choice, chat_logprobs, chat_response, completion_logprobs, sse,
                                              text_response, token_pieces)


def _visible_ids(completion: Completion, no_stop_trim: bool) -> list[int]:
    """The generated ids whose text is the turn: without the stop token that ended it (unless kept)."""
    ids = completion.output_ids
    matched = completion.matched_stop
    if not no_stop_trim and isinstance(matched, int) and not isinstance(matched, bool) and ids:
        return ids[:-1]
    return ids


def _decoded(tokenizer, completion: Completion, req, skip_special: bool) -> str:
    return output_text(completion.output_ids, {"matched": completion.matched_stop}, tokenizer,
                       skip_special_tokens=skip_special, no_stop_trim=req.no_stop_trim)


def skip_special(req: ChatIn, rendered: Rendered) -> bool:
    """SGLang keeps special tokens in the text when tools are in play (a parser may need them)."""
    return req.skip_special_tokens and not rendered.tools


@dataclass
class Prepared:
    """A validated chat call rendered with the model's template, not generated yet."""

    body: dict
    req: ChatIn
    rendered: Rendered
    sampling: dict  # SGLang sampling_params

    @property
    def top_logprobs(self) -> int:
        return (self.req.top_logprobs or 0) if self.req.logprobs else 0


def prepare_chat(backend: Backend, body: dict) -> Prepared:
    """Validate and render one `/v1/chat/completions` request (OpenAIError 400 naming what is wrong)."""
    req = parse_chat(body)
    rendered = render_chat(backend.tokenizer, req)
    return Prepared(body, req, rendered, sampling_params(req, rendered.stop_ids,
                                                         max_tokens=req.max_completion_tokens or req.max_tokens))


async def chat_completion(backend: Backend, body: dict, prepared: Prepared | None = None) -> ChatCall:
    """One `/v1/chat/completions` call, not streamed yet (`chat_stream` writes a stream of it)."""
    p = prepared or prepare_chat(backend, body)
    completions = await backend.generate(p.rendered.prompt_ids, p.sampling, n=p.req.n, top_logprobs=p.top_logprobs)
    return build_call(backend, p, completions)


def build_call(backend: Backend, p: Prepared, completions: list[Completion]) -> ChatCall:
    """The ChatCall of generated choices: tool calls parsed, the response object built."""
    req, rendered, tok = p.req, p.rendered, backend.tokenizer
    names = {t["function"]["name"] for t in rendered.tools or ()}
    skip = skip_special(req, rendered)
    choices, deltas, rejected = [], [], []
    for i, c in enumerate(completions):
        turn = parse_turn(_decoded(tok, c, req, skip), prefix=rendered.prefix, visible_from=len(rendered.client_prefix),
                          tool_names=names or None, parallel=req.parallel_tool_calls)
        rejected.append(turn.rejected)
        logprobs = chat_logprobs(tok, c) if req.logprobs else None
        choices.append(chat_choice(i, turn, c, logprobs))
        if req.stream:
            ids = None if turn.tool_calls else _visible_ids(c, req.no_stop_trim)
            deltas.append(content_deltas(tok, ids, turn.content, logprobs, skip))
    response = chat_response(req.model or backend.model_name(), choices, len(rendered.prompt_ids), completions)
    return ChatCall(request=p.body, prompt_ids=rendered.prompt_ids, choices=completions, response=response,
                    messages=list(req.messages), tools=p.body.get("tools"), prefix=rendered.prefix,
                    deltas=deltas if req.stream else None, rejected=rejected)


def content_deltas(tokenizer, ids: list[int] | None, content: str, logprobs: list | None,
                   skip_special_tokens: bool) -> list[tuple[str, list]]:
    """(text, log-prob entries) deltas of one choice's content: a token's text at a time when the
    content is its tokens' text (`ids`, cut short at a stop string), else the content at once."""
    entries = list(logprobs or [])
    whole = [(content, entries)] if content or entries else []
    if ids is None:
        return whole
    pieces = token_pieces(tokenizer, ids, skip_special_tokens)
    if not "".join(pieces).startswith(content):
        return whole
    deltas, sent, pending = [], 0, []
    for k, piece in enumerate(pieces):
        pending += entries[k:k + 1]
        piece = piece[:max(0, len(content) - sent)]
        if piece:
            deltas.append((piece, pending))
            sent, pending = sent + len(piece), []
    pending += entries[len(pieces):]  # the trimmed stop token's entry
    if pending:
        deltas.append(("", pending))
    return deltas


def _chunk(response: dict, choice: dict | None, **fields) -> str:
    obj = {"id": response["id"], "object": "chat.completion.chunk", "created": response["created"],
           "model": response["model"], "choices": [] if choice is None else [choice]}
    obj.update(fields)
    return sse(obj)


async def chat_stream(call: ChatCall) -> AsyncIterator[str]:
    """The call as `chat.completion.chunk` events (see the module docstring), ending `data: [DONE]`."""
    response = call.response
    meta = {"metadata": response["metadata"]}
    for choice in response["choices"]:
        index, message, lp = choice["index"], choice["message"], choice["logprobs"]
        yield _chunk(response, {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                "finish_reason": None}, **meta)
        if call.deltas is not None:
            deltas = call.deltas[index]
        else:
            entries = lp["content"] if lp else []
            deltas = [(message["content"], entries)] if message["content"] or entries else []
        for text, entries in deltas:
            yield _chunk(response, {"index": index, "delta": {"content": text} if text else {}, "finish_reason": None,
                                    "logprobs": {"content": entries} if lp else None}, **meta)
        for tc in message["tool_calls"] or ():
            yield _chunk(response, {"index": index, "delta": {"tool_calls": [tc]}, "logprobs": None,
                                    "finish_reason": None}, **meta)
        yield _chunk(response, {"index": index, "delta": {}, "logprobs": None, "finish_reason": choice["finish_reason"],
                                "matched_stop": choice["matched_stop"]}, **meta)
    if (call.request.get("stream_options") or {}).get("include_usage"):
        yield _chunk(response, None, usage=response["usage"], **meta)
    yield DONE


def _prompts(req: CompletionIn, tokenizer) -> list[list[int]]:
    p = req.prompt
    if isinstance(p, str):
        return [tokenizer.encode(p)]
    if p and all(isinstance(x, int) for x in p):
        return [list(p)]
    return [tokenizer.encode(x) if isinstance(x, str) else list(x) for x in p]


async def text_completion(backend: Backend, body: dict) -> dict:
    """One `/v1/completions` call: choices prompt-major, `n` per prompt, every prompt submitted at once."""
    req = parse_completion(body)
    tok = backend.tokenizer
    sampling = sampling_params(req, max_tokens=req.max_tokens)
    prompts = _prompts(req, tok)
    try:
        results = await asyncio.gather(*(backend.generate(ids, sampling, n=req.n, top_logprobs=req.logprobs or 0)
                                         for ids in prompts))
    except OpenAIError as exc:
        if exc.param == "top_logprobs":  # the completions API asks for top-k with `logprobs`
            exc.param, exc.message = "logprobs", exc.message.replace("top_logprobs", "logprobs")
        raise
    done = [c for per_prompt in results for c in per_prompt]
    choices = [{"index": i, "text": _decoded(tok, c, req, req.skip_special_tokens),
                "logprobs": None if req.logprobs is None else completion_logprobs(tok, c, req.logprobs),
                "finish_reason": c.finish_reason, "matched_stop": c.matched_stop} for i, c in enumerate(done)]
    return text_response(req.model or backend.model_name(), choices, sum(len(p) for p in prompts), done)


async def completion_stream(response: dict, include_usage: bool = False) -> AsyncIterator[str]:
    """A finished text completion as events: each choice's text in one chunk, then its finish."""
    base = {"id": response["id"], "object": "text_completion", "created": response.get("created", int(time.time())),
            "model": response["model"], "metadata": response["metadata"]}
    for choice in response["choices"]:
        yield sse({**base, "choices": [{**choice, "finish_reason": None, "matched_stop": None}]})
        yield sse({**base, "choices": [{"index": choice["index"], "text": "", "logprobs": None,
                                        "finish_reason": choice["finish_reason"], "matched_stop": choice["matched_stop"]}]})
    if include_usage:
        yield sse({**base, "choices": [], "usage": response["usage"]})
    yield DONE

