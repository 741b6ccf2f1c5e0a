"""A generated turn -> content + tool_calls (engines/openai_api/parse.py) and the streamed deltas of a turn
(engines/openai_api/service.py): Hermes blocks naming offered tools become calls, everything else stays
content; a call opened in the prompt is read with its generated end; streamed text and log-probs
concatenate to the non-streamed ones."""

from __future__ import annotations

import json
import re

import pytest

from agentrl_cli.model.tokenizer import build_tokenizer
from agentrl_cli.engines.openai_api.base import Completion
from agentrl_cli.engines.openai_api.parse import parse_turn
from agentrl_cli.engines.openai_api.responses import chat_choice, chat_logprobs, token_pieces
from agentrl_cli.engines.openai_api.service import content_deltas

CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call>'
NAMES = {"calculator", "clock"}


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def test_a_hermes_block_naming_an_offered_tool_becomes_a_call():
    turn = parse_turn("Let me compute.\n" + CALL, tool_names=NAMES)
    assert turn.content == "Let me compute."
    (call,) = turn.tool_calls
    assert re.fullmatch(r"call_[0-9a-f]{24}", call["id"]) and call["index"] == 0 and call["type"] == "function"
    assert call["function"]["name"] == "calculator"
    assert json.loads(call["function"]["arguments"]) == {"expression": "2+3"}


def test_several_calls_keep_their_order_and_parallel_false_keeps_the_first():
    two = CALL + "\n" + CALL.replace("calculator", "clock").replace('{"expression": "2+3"}', "{}")
    turn = parse_turn(two, tool_names=NAMES)
    assert [c["function"]["name"] for c in turn.tool_calls] == ["calculator", "clock"]
    assert [c["index"] for c in turn.tool_calls] == [0, 1] and turn.content == ""
    one = parse_turn(two, tool_names=NAMES, parallel=False)
    assert [c["function"]["name"] for c in one.tool_calls] == ["calculator"] and "clock" in one.content


@pytest.mark.parametrize("text", [
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": \n</tool_call>',  # malformed JSON
    CALL.replace("calculator", "rm_rf"),  # a tool nobody offered
    '<tool_call>\n{"name": "calculator", "arguments": {}}',  # never closed
])
def test_a_block_that_is_not_a_valid_offered_call_stays_in_the_content_and_is_rejected(text):
    turn = parse_turn(text, tool_names=NAMES)
    assert turn.tool_calls == [] and turn.content == text and len(turn.rejected) == 1


def test_only_blocks_the_model_wrote_are_rejected_and_a_call_left_out_by_parallel_false_is_not():
    bad = '<tool_call>\n{"name": "calculator", "arguments": 7}\n</tool_call>'
    assert parse_turn(" Done.", prefix=bad, visible_from=len(bad), tool_names=NAMES).rejected == []  # the client's text
    assert parse_turn("Hm. " + bad, tool_names=NAMES).rejected == ["a tool call: arguments must be an object"]
    assert parse_turn(CALL + CALL, tool_names=NAMES, parallel=False).rejected == []
    assert parse_turn("no calls here", tool_names=NAMES).rejected == []


def test_without_tools_nothing_is_parsed():
    assert parse_turn(CALL, tool_names=None).content == CALL


def test_a_call_opened_in_the_prompt_is_read_with_its_generated_end():
    prefix = '<tool_call>\n{"name": "calculator", "arguments": '
    turn = parse_turn('{"expression": "7*6"}}\n</tool_call>', prefix=prefix, tool_names=NAMES)
    assert json.loads(turn.tool_calls[0]["function"]["arguments"]) == {"expression": "7*6"} and turn.content == ""


def test_the_clients_own_prefix_is_not_echoed_back_as_content():
    turn = parse_turn(" 42.", prefix="The answer is", visible_from=len("The answer is"), tool_names=None)
    assert turn.content == " 42."
    called = parse_turn(" Done.", prefix=CALL, visible_from=len(CALL), tool_names=NAMES)
    assert called.content == "Done." and len(called.tool_calls) == 1


def test_a_stopped_turn_with_calls_finishes_with_tool_calls_and_no_matched_stop():
    turn = parse_turn(CALL, tool_names=NAMES)
    stopped = chat_choice(0, turn, Completion([1, 2], [-0.1, -0.2], "stop", matched_stop=2), None)
    assert stopped["finish_reason"] == "tool_calls" and stopped["matched_stop"] is None
    cut = chat_choice(0, turn, Completion([1, 2], [-0.1, -0.2], "length"), None)
    assert cut["finish_reason"] == "length"  # SGLang: only a natural stop becomes tool_calls
    plain = chat_choice(0, parse_turn("hi", tool_names=NAMES), Completion([1, 2], [-0.1, -0.2], "stop", matched_stop=2), None)
    assert plain["finish_reason"] == "stop" and plain["matched_stop"] == 2 and plain["message"]["tool_calls"] is None


def test_token_pieces_concatenate_to_the_decoded_text(tok):
    ids = tok.encode("Über 42 lines: naïve café ☕ done.", add_special_tokens=False)
    pieces = token_pieces(tok, ids)
    assert "".join(pieces) == tok.decode(ids) and sum(1 for p in pieces if p) > 5


def test_streamed_deltas_concatenate_to_the_content_and_its_logprobs(tok):
    ids = tok.encode("alpha beta STOP gamma", add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]
    completion = Completion(ids, [-float(i) / 10 for i in range(len(ids))], "stop", matched_stop="STOP")
    logprobs = chat_logprobs(tok, completion)
    content = "alpha beta "  # cut before the stop string, as the server cuts it
    deltas = content_deltas(tok, ids, content, logprobs, True)
    assert "".join(text for text, _ in deltas) == content and len(deltas) > 2
    assert [e for _, entries in deltas for e in entries] == logprobs  # every token's entry, in order, once
    whole = content_deltas(tok, None, "x" + content, logprobs, True)  # content is not the tokens' text: one delta
    assert whole == [("x" + content, logprobs)]


def test_chat_logprobs_have_openai_fields_for_every_token(tok):
    ids = tok.encode("hi there", add_special_tokens=False)
    entries = chat_logprobs(tok, Completion(ids, [-0.5] * len(ids), "length"))
    assert [e["token"] for e in entries] == [tok.decode([i]) for i in ids]
    assert all(e["bytes"] == list(e["token"].encode()) and e["logprob"] == -0.5 and e["top_logprobs"] == [] for e in entries)
