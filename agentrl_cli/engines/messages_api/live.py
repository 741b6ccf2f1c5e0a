"""A streamed `POST /v1/messages` written as its tokens are generated: the Messages events of a live
chat call's `Delta`s (`openai_api.live`; on a gateway, the recorded ones of `Gateway.chat_deltas`),
the same events `reply.message_events` writes of a finished call.

What is sent when:
- `message_start` (id `msg_<hex>` of the call's `chatcmpl-<hex>`, the prompt's tokens as served)
  with the first tokens;
- a `text` block opened with the first text, then a `text_delta` per content delta as it comes:
  the text the chat stream sends, which holds back everything from a `<tool_call>` opening on, so
  a tool call is never guessed from partial text;
- once the call is complete (recorded by then, on a gateway): the text block closed, one
  `tool_use` block per call the model's format parsed (its input as one `input_json_delta`), then
  `message_delta` (stop reason, usage of the complete call) and `message_stop`.
A failure after the stream began ends it with an `error` event. A client that goes away closes the
deltas: the generation is aborted and nothing is recorded.

Not here: the events' shapes (`reply.py`), HTTP (`routes.py`, the gateway's app).
"""

from __future__ import annotations

from typing import AsyncIterator, Iterator

from agentrl_cli.engines.inference.awaiting import Stream
from agentrl_cli.engines.messages_api.reply import (event, failure_event, message_id, stop_reason, tool_use_id,
                                                    usage_block)
from agentrl_cli.engines.openai_api.base import ChatCall
from agentrl_cli.engines.openai_api.live import Delta, LiveChat


def live_message_events(live: LiveChat, deltas: AsyncIterator[Delta],
                        stop_sequences: list[str] = ()) -> AsyncIterator[str]:
    """The Messages events of `live`'s `deltas` as they come; closing them closes `deltas`."""
    return Stream(_events(live, deltas, list(stop_sequences)), deltas.aclose)


async def _events(live: LiveChat, deltas: AsyncIterator[Delta], stops: list[str]) -> AsyncIterator[str]:
    index, text_open = -1, False
    try:
        async for d in deltas:
            if d.kind == "start":
                yield event("message_start", {"message": {
                    "id": message_id(live.id), "type": "message", "role": "assistant", "model": live.model,
                    "content": [], "stop_reason": None, "stop_sequence": None,
                    "usage": usage_block(live.prompt_tokens, 0)}})
            elif d.kind == "content" and d.text:
                if not text_open:
                    index, text_open = index + 1, True
                    yield event("content_block_start", {"index": index, "content_block": {"type": "text", "text": ""}})
                yield event("content_block_delta", {"index": index, "delta": {"type": "text_delta", "text": d.text}})
            elif d.kind == "done":
                if text_open:
                    yield event("content_block_stop", {"index": index})
                for line in _ending(d.call, index + 1, stops):
                    yield line
    except Exception as exc:  # noqa: BLE001 - the stream began: the failure is an event, not a status
        yield failure_event(exc)
    finally:
        await deltas.aclose()


def _ending(call: ChatCall, index: int, stops: list[str]) -> Iterator[str]:
    """The tool_use blocks of a complete call (from block `index` on), its stop reason and usage."""
    choice = call.response["choices"][0]
    for k, tc in enumerate(choice["message"].get("tool_calls") or ()):
        fn = tc["function"]
        yield event("content_block_start", {"index": index + k, "content_block": {
            "type": "tool_use", "id": tool_use_id(tc["id"]), "name": fn["name"], "input": {}}})
        if fn.get("arguments"):
            yield event("content_block_delta", {"index": index + k, "delta": {
                "type": "input_json_delta", "partial_json": fn["arguments"]}})
        yield event("content_block_stop", {"index": index + k})
    reason, sequence = stop_reason(choice["finish_reason"], choice.get("matched_stop"), stops)
    usage = call.response["usage"]
    yield event("message_delta", {"delta": {"stop_reason": reason, "stop_sequence": sequence},
                                  "usage": usage_block(usage["prompt_tokens"], usage["completion_tokens"])})
    yield event("message_stop", {})
