"""A streamed chat call written as its tokens are generated: `live_chat` submits the call to a
backend that streams (`Backend.streams`, one choice) and `LiveChat.events` writes its
`chat.completion.chunk` events while the backend yields tokens.

What is sent when:
- the role chunk with the first tokens (it carries the weight version they were sampled with);
- the content as the tokens' text, decoded incrementally over a short window so a multi-byte
  character is never split, one token behind (the last token may be the stop token the turn drops)
  and holding back text that may still turn out not to be content: a tail that may begin a stop
  string; with tools offered, everything from a `<tool_call>` opening on (a call is parsed by the
  model's format once the turn is complete, never guessed from partial text), whitespace before it
  (a turn with calls has its content trimmed) and a turn that starts with whitespace. A turn whose
  assistant prefix is in the prompt (a forced call, `continue_final_message`) is sent at the end;
- once the generation is complete: the call is built as a non-streamed one would be
  (`service.build_call`, same ids), the recorder hook sees it (`on_call`, a gateway's), then the rest
  of the content, the parsed tool calls, the finish chunk, usage when asked, `[DONE]`. The sent
  content is always a prefix of the final content, so the deltas concatenate to the message.
Each content chunk carries the log-prob entries of the tokens decoded into it; the chunks' id is
the call's response id (what a gateway records and rewards by).

A client that goes away mid-stream closes the iterator: the backend's stream is closed (the
generation aborted) and `on_abort` is called; nothing is recorded.

Other dialects stream the same turn by translating `LiveChat.deltas` (start, content, done with
the complete call) into their own events: the Responses API (`responses_live.py`) and the Messages
API (`engines/messages_api/live.py`); a recording gateway hands them its recorded deltas
(`Gateway.chat_deltas`), so every dialect is recorded from the ids it streamed.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from typing import AsyncIterator, Awaitable, Callable

from agentrl_cli.engines.inference.awaiting import Stream
from agentrl_cli.engines.inference.detokenize import Detokenizer
from agentrl_cli.engines.openai_api.base import Backend, ChatCall, Completion, OpenAIError, TokenChunk
from agentrl_cli.engines.openai_api.responses import DONE, chat_logprobs, sse
from agentrl_cli.engines.openai_api.service import Prepared, build_call, prepare_chat, skip_special

log = logging.getLogger(__name__)
OPENING = "<tool_call>"  # where a Hermes call begins (`parse.py` reads the calls once the turn is complete)


def sendable(text: str, stops: list[str], tools: bool) -> int:
    """How much of `text` (the turn's text so far) is content whatever the tokens that follow."""
    end = len(text)
    for s in stops:
        at = text.find(s)
        end = min(end, at) if at != -1 else end
    if tools:
        if text[:1].isspace():
            return 0
        at = text.find(OPENING)
        end = min(end, at) if at != -1 else end
    for s in [*stops, *([OPENING] if tools else [])]:  # a tail that may begin one
        for k in range(min(len(s) - 1, end), 0, -1):
            if text[:end].endswith(s[:k]):
                end -= k
                break
    if tools:
        end = len(text[:end].rstrip())
    return end


@dataclass
class Delta:
    """One step of a streamed turn: "start" (the first tokens came), "content" (`text` and its tokens'
    log-prob entries, None unless asked), "done" (`call`: the complete call, tool calls parsed, seen
    by `on_call`; the content is complete before it)."""

    kind: str
    text: str = ""
    logprobs: list | None = None
    weight_version: str = ""
    call: ChatCall | None = None


class LiveChat:
    """One streamed call being generated; iterate `events` (chat chunks) or `deltas` once. `id`: the
    id the call is served and recorded under (`call_id`, a Responses `resp_…`, else a new
    `chatcmpl-…`); `prompt_tokens`: the prompt's length as served (a gateway sets the ids it sent)."""

    def __init__(self, backend: Backend, prepared: Prepared, chunks: AsyncIterator[TokenChunk],
                 call_id: str | None = None) -> None:
        self.backend, self.p, self.chunks = backend, prepared, chunks
        self.id, self.created = call_id or f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        self.model = prepared.req.model or backend.model_name()
        self.prompt_tokens = len(prepared.rendered.prompt_ids)
        self.call: ChatCall | None = None  # once complete

    def _chunk(self, version: str, choice: dict | None, **fields) -> str:
        obj = {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
               "choices": [] if choice is None else [choice], "metadata": {"weight_version": version}}
        obj.update(fields)
        return sse(obj)

    def _content(self, version: str, text: str, entries: list | None) -> str:
        return self._chunk(version, {"index": 0, "delta": {"content": text} if text else {}, "finish_reason": None,
                                     "logprobs": None if entries is None else {"content": entries}})

    def deltas(self, on_call: Callable[[ChatCall], Awaitable[None]] | None = None,
               on_abort: Callable[[], None] | None = None) -> AsyncIterator[Delta]:
        """The turn as `Delta`s, for any dialect's stream (`events` writes chat chunks of them);
        `on_call` sees the complete call before the last deltas, `on_abort` is called when the stream
        ends before that (the client went away, the backend failed)."""
        async def never_started() -> None:
            await self.chunks.aclose()
            if on_abort is not None:
                on_abort()

        return Stream(self._deltas(on_call, on_abort), never_started)

    def events(self, on_call: Callable[[ChatCall], Awaitable[None]] | None = None,
               on_abort: Callable[[], None] | None = None) -> AsyncIterator[str]:
        """The call's `chat.completion.chunk` server-sent events, ending `data: [DONE]`."""
        return self.chat_events(self.deltas(on_call, on_abort))

    def chat_events(self, deltas: AsyncIterator[Delta]) -> AsyncIterator[str]:
        """`deltas` (this call's, from `deltas`) as chat chunks; closing the events closes `deltas`."""
        return Stream(self._chat_events(deltas), deltas.aclose)

    async def _chat_events(self, deltas) -> AsyncIterator[str]:
        try:
            async for d in deltas:
                if d.kind == "start":
                    yield self._chunk(d.weight_version, {"index": 0, "delta": {"role": "assistant", "content": ""},
                                                         "logprobs": None, "finish_reason": None})
                elif d.kind == "content":
                    yield self._content(d.weight_version, d.text, d.logprobs)
                else:
                    choice = d.call.response["choices"][0]
                    for tc in choice["message"]["tool_calls"] or ():
                        yield self._chunk(d.weight_version, {"index": 0, "delta": {"tool_calls": [tc]},
                                                             "logprobs": None, "finish_reason": None})
                    yield self._chunk(d.weight_version, {"index": 0, "delta": {}, "logprobs": None,
                                                         "finish_reason": choice["finish_reason"],
                                                         "matched_stop": choice["matched_stop"]})
                    if (self.p.body.get("stream_options") or {}).get("include_usage"):
                        yield self._chunk(d.weight_version, None, usage=d.call.response["usage"])
                    yield DONE
        finally:
            await deltas.aclose()

    async def _deltas(self, on_call, on_abort) -> AsyncIterator[Delta]:
        req, rendered, tok = self.p.req, self.p.rendered, self.backend.tokenizer
        text = Detokenizer(tok, skip_special(req, rendered))
        tools = bool(rendered.tools)
        stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        live = not rendered.prefix and not req.no_stop_trim
        got: list[tuple[int, float]] = []  # every token so far
        sent, decoded, covered, done, version, deltas = "", 0, 0, None, "", []
        try:
            try:
                async for chunk in self.chunks:
                    if not got and (chunk.ids or chunk.done is not None):
                        version = chunk.weight_version or (chunk.done.weight_version if chunk.done else "")
                        yield Delta("start", weight_version=version)
                    got += zip(chunk.ids, chunk.logprobs)
                    if chunk.done is not None:
                        done = chunk.done
                        break
                    if not live or len(got) - 1 <= decoded:
                        continue
                    text.add([t for t, _ in got[decoded:len(got) - 1]])  # one token behind: it may be the stop
                    decoded = len(got) - 1
                    end = sendable(text.text, stops, tools)
                    if end > len(sent):
                        piece = text.text[len(sent):end]
                        entries = self._entries(got[covered:decoded]) if req.logprobs else None
                        deltas.append((piece, entries or []))
                        sent, covered = sent + piece, decoded
                        yield Delta("content", piece, entries, version)
            finally:
                await self.chunks.aclose()
            if done is None:
                raise OpenAIError("the backend's stream ended without its final chunk", status=500, type="server_error")
            async for delta in self._finish(done, sent, deltas, covered, on_call):
                yield delta
        except BaseException:  # the client went away (GeneratorExit, cancelled), or the backend failed
            if self.call is None and on_abort is not None:
                on_abort()
            raise

    def _entries(self, tokens: list[tuple[int, float]]) -> list[dict]:
        return chat_logprobs(self.backend.tokenizer, Completion([t for t, _ in tokens], [lp for _, lp in tokens], ""))

    async def _finish(self, done: Completion, sent: str, deltas: list, covered: int, on_call) -> AsyncIterator[Delta]:
        call = build_call(self.backend, self.p, [done])
        call.response["id"], call.response["created"] = self.id, self.created
        content = call.response["choices"][0]["message"]["content"] or ""
        rest = content[len(sent):]
        if not content.startswith(sent):  # cannot happen by `sendable`'s rules; say so if it does
            log.warning("a live stream sent %r, which does not begin the turn's content %r", sent, content)
            rest = ""
        entries = self._entries(list(zip(done.output_ids, done.output_logprobs))[covered:]) if self.p.req.logprobs \
            else None
        call.deltas = [deltas + ([(rest, entries or [])] if rest or entries else [])]
        if on_call is not None:
            await on_call(call)
        self.call = call
        version = call.response["metadata"]["weight_version"]
        if rest or entries:
            yield Delta("content", rest, entries, version)
        yield Delta("done", weight_version=version, call=call)


async def live_deltas(backend: Backend, body: dict, *, on_call: Callable[[ChatCall], Awaitable[None]] | None = None,
                      call_id: str | None = None) -> tuple[LiveChat, AsyncIterator[Delta]] | None:
    """A chat body submitted live (`live_chat`) and its `deltas`, for a dialect's stream on a server
    (a gateway has its own, recording: `Gateway.chat_deltas`); None when it is not written live."""
    live = await live_chat(backend, prepare_chat(backend, body), call_id=call_id)
    return None if live is None else (live, live.deltas(on_call))


def streams_live(backend: Backend, p: Prepared) -> bool:
    """Whether the call is written as it is generated: streamed, one choice, a backend that streams."""
    return bool(p.req.stream) and p.req.n == 1 and bool(getattr(backend, "streams", False))


async def live_chat(backend: Backend, p: Prepared, *, call_id: str | None = None) -> LiveChat | None:
    """Submit a streamed call to a backend that streams (raising what submitting raises: HTTP errors);
    None when the call is not written live (`streams_live`). `call_id`: the id to serve it under."""
    if not streams_live(backend, p):
        return None
    chunks = await backend.generate_stream(p.rendered.prompt_ids, p.sampling, top_logprobs=p.top_logprobs)
    return LiveChat(backend, p, chunks, call_id)
