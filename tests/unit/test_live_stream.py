"""What a live stream may send before the turn is complete (`openai_api.live.sendable`), and how the
gateway's client reads SGLang's `/generate` stream chunks, cumulative or incremental."""

from __future__ import annotations

import pytest

from agentrl_cli.engines.inference.client import _new_tokens
from agentrl_cli.engines.openai_api.live import sendable


@pytest.mark.parametrize("text, stops, tools, sent", [
    ("Hello there", [], False, "Hello there"),
    ("Hello the", ["there"], False, "Hello "),  # "the" may begin the stop string
    ("Hello there, friend", ["there"], False, "Hello "),  # the stop string itself is never content
    ("Sure. <tool_ca", [], True, "Sure."),  # may open a call: held, and the space before it
    ('Sure. <tool_call>{"name": "x"', [], True, "Sure."),  # a call is parsed once complete, never guessed
    ("  leading space", [], True, ""),  # a turn with calls is trimmed: held until the end
    ("Plain text <b>", [], True, "Plain text <b>"),
])
def test_sendable_holds_back_what_may_not_be_content(text, stops, tools, sent):
    assert text[:sendable(text, stops, tools)] == sent


def test_stream_chunks_are_read_cumulative_or_incremental():
    def chunk(ids, total):
        return {"output_ids": ids, "meta_info": {"completion_tokens": total,
                                                 "output_token_logprobs": [[-0.5, t, None] for t in ids]}}
    assert _new_tokens(chunk([5, 6], 2), 0) == ([5, 6], [-0.5, -0.5])
    assert _new_tokens(chunk([5, 6, 7], 3), 2) == ([7], [-0.5])  # SGLang's default: all ids so far
    assert _new_tokens(chunk([7, 8], 4), 2) == ([7, 8], [-0.5, -0.5])  # incremental (the embedded server)
