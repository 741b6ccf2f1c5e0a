"""The Messages API translation, both ways: a Messages request becomes the chat-completion body the
OpenAI-compatible path serves (system, blocks, tool_use / tool_result, tools, tool_choice, prefill,
sampling), every refusal names the field; a chat completion and its chunk stream become a `message`
and its events (stop reasons, ids, usage, input_json_delta)."""

from __future__ import annotations

import asyncio
import json

import pytest

from agentrl_cli.engines.messages_api import message_events, to_chat, to_message
from agentrl_cli.engines.openai_api import OpenAIError

TOOL = {"name": "lookup", "description": "Look a word up.", "cache_control": {"type": "ephemeral"},
        "input_schema": {"type": "object", "properties": {"word": {"type": "string"}}}}


def body(**fields) -> dict:
    return {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], **fields}


def test_a_tool_loop_conversation_becomes_chat_messages_in_order():
    chat = to_chat(body(
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}, {"type": "text", "text": "Use tools."}],
        messages=[{"role": "user", "content": "define gateway"},
                  {"role": "assistant", "content": [{"type": "text", "text": "Looking."},
                                                    {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"word": "gateway"}}]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "a door"}]},
                                               {"type": "tool_result", "tool_use_id": "toolu_2", "content": "gone", "is_error": True},
                                               {"type": "text", "text": "and now?"}]}],
        tools=[TOOL], tool_choice={"type": "any", "disable_parallel_tool_use": True},
        temperature=0.5, top_k=5, stop_sequences=["END"], stream=True, metadata={"user_id": "u"}))
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief.\nUse tools."},
        {"role": "user", "content": "define gateway"},
        {"role": "assistant", "content": "Looking.", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "lookup", "arguments": '{"word": "gateway"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "a door"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: gone"},
        {"role": "user", "content": "and now?"}]
    assert chat["tools"] == [{"type": "function", "function": {"name": "lookup", "description": "Look a word up.",
                                                                "parameters": TOOL["input_schema"]}}]
    assert chat["tool_choice"] == "required" and chat["parallel_tool_calls"] is False
    assert (chat["temperature"], chat["top_k"], chat["stop"], chat["max_tokens"]) == (0.5, 5, ["END"], 8)
    assert chat["stream"] is True and chat["stream_options"] == {"include_usage": True}


def test_a_named_tool_choice_and_an_assistant_prefill():
    chat = to_chat(body(tools=[TOOL], tool_choice={"type": "tool", "name": "lookup"},
                        messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Well,"}]))
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "lookup"}}
    assert chat["continue_final_message"] is True and chat["messages"][-1] == {"role": "assistant", "content": "Well,"}


@pytest.mark.parametrize(("fields", "param"), [
    ({"max_tokens": None}, "max_tokens"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_p": 0}, "top_p"),
    ({"logit_bias": {}}, "logit_bias"),
    ({"thinking": {"type": "enabled", "budget_tokens": 2000}}, "thinking"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}, "messages[0].content[0].type"),
    ({"messages": [{"role": "assistant", "content": [{"type": "thinking", "thinking": "x"}]}]}, "messages[0].content[0].type"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
    ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, "tools[0].type"),
    ({"tools": [TOOL], "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice.name"),
    ({"tool_choice": {"type": "any"}}, "tool_choice"),
    ({"stop_sequences": [" "]}, "stop_sequences"),
])
def test_a_refusal_names_the_field(fields, param):
    request = body(**fields)
    if fields.get("max_tokens", 0) is None:
        del request["max_tokens"]
    with pytest.raises(OpenAIError) as info:
        to_chat(request)
    assert info.value.param == param and info.value.status == 400 and info.value.message.startswith(param)


def _response(finish: str, matched=None, content="Hi", calls=()) -> dict:
    return {"id": "chatcmpl-abc", "model": "m", "usage": {"prompt_tokens": 7, "completion_tokens": 3},
            "choices": [{"index": 0, "finish_reason": finish, "matched_stop": matched,
                         "message": {"role": "assistant", "content": content, "tool_calls": list(calls) or None}}]}


CALL = {"id": "call_0123", "index": 0, "type": "function", "function": {"name": "lookup", "arguments": '{"word": "x"}'}}


@pytest.mark.parametrize(("finish", "matched", "reason", "sequence"), [
    ("stop", 2, "end_turn", None), ("stop", "END", "stop_sequence", "END"), ("length", None, "max_tokens", None),
    ("abort", None, "pause_turn", None), ("tool_calls", None, "tool_use", None)])
def test_the_message_says_why_it_stopped(finish, matched, reason, sequence):
    msg = to_message(_response(finish, matched), ["END"])
    assert (msg["stop_reason"], msg["stop_sequence"]) == (reason, sequence)
    assert msg["id"] == "msg_abc" and msg["usage"]["input_tokens"] == 7 and msg["usage"]["output_tokens"] == 3


def test_a_tool_call_is_a_tool_use_block_after_the_text():
    msg = to_message(_response("tool_calls", content="Let me see.", calls=[CALL]))
    assert msg["content"] == [{"type": "text", "text": "Let me see."},
                              {"type": "tool_use", "id": "toolu_0123", "name": "lookup", "input": {"word": "x"}}]
    assert to_message(_response("stop", content=""))["content"] == []


def test_the_chunk_stream_becomes_the_messages_events_in_order():
    def chunk(delta=None, finish=None, usage=None):
        choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish, "matched_stop": None}]
        return "data: " + json.dumps({"id": "chatcmpl-abc", "model": "m", "choices": choices,
                                      **({"usage": usage} if usage else {})}) + "\n\n"

    async def chat_sse():
        for line in (chunk({"role": "assistant", "content": ""}), chunk({"content": "Hi"}), chunk({"content": " there"}),
                     chunk({"tool_calls": [CALL]}), chunk({}, "tool_calls"),
                     chunk(usage={"prompt_tokens": 7, "completion_tokens": 3}), "data: [DONE]\n\n"):
            yield line

    async def collect():
        return [e async for e in message_events(chat_sse(), input_tokens=7)]

    events = [json.loads(e.split("data: ", 1)[1]) for e in asyncio.run(collect())]
    assert [e["type"] for e in events] == [
        "message_start", "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop"]
    assert events[0]["message"]["id"] == "msg_abc" and events[0]["message"]["usage"]["input_tokens"] == 7
    assert events[5]["content_block"] == {"type": "tool_use", "id": "toolu_0123", "name": "lookup", "input": {}}
    assert events[6]["delta"] == {"type": "input_json_delta", "partial_json": '{"word": "x"}'} and events[6]["index"] == 1
    assert events[8]["delta"]["stop_reason"] == "tool_use" and events[8]["usage"]["output_tokens"] == 3


def test_a_failure_after_the_stream_began_is_an_error_event():
    async def chat_sse():
        yield "data: " + json.dumps({"id": "chatcmpl-abc", "model": "m", "choices": [
            {"index": 0, "delta": {"content": "Hi"}, "finish_reason": None}]}) + "\n\n"
        raise OpenAIError("the inference servers did not complete the generation", status=503, type="server_error")

    async def collect():
        return [e async for e in message_events(chat_sse())]

    events = asyncio.run(collect())
    assert [e.split("\n", 1)[0] for e in events] == ["event: message_start", "event: content_block_start",
                                                     "event: content_block_delta", "event: error"]
    assert json.loads(events[-1].split("data: ", 1)[1]) == {"type": "error", "error": {
        "type": "overloaded_error", "message": "the inference servers did not complete the generation"}}
