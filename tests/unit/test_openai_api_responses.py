"""The Responses API's translation onto a chat call (`engines/openai_api/responses_api.py`): input
items become the messages the chat template renders, an assistant turn's text and calls one message,
and what is not served is refused naming the field."""

from __future__ import annotations

import pytest

from agentrl_cli.engines.openai_api import OpenAIError
from agentrl_cli.engines.openai_api.responses_api import chat_body, input_messages, parse_responses


def call(call_id: str, name: str = "f") -> dict:
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": "{}", "id": "fc_1",
            "status": "completed"}


def test_an_assistant_message_and_the_calls_after_it_are_one_turn():
    items = [{"role": "user", "content": "hi"},
             {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
              "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}]},
             call("c1"), call("c2", "g"),
             {"type": "function_call_output", "call_id": "c1", "output": "1"},
             {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "2"}]},
             call("c3"), {"role": "assistant", "content": "after the call"}]
    messages = input_messages(items)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool", "assistant", "assistant"]
    assert messages[1]["content"] == "Let me look." and [c["id"] for c in messages[1]["tool_calls"]] == ["c1", "c2"]
    assert messages[3] == {"role": "tool", "tool_call_id": "c2", "content": "2"}
    assert messages[4] == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c3", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    assert messages[5] == {"role": "assistant", "content": "after the call"}


def test_instructions_history_and_input_make_the_chat_body_with_tools_in_the_chat_shape():
    req = parse_responses({"model": "m", "instructions": "Be brief.", "input": "again", "max_output_tokens": 5,
                           "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": True}],
                           "tool_choice": {"type": "function", "name": "f"}, "include": [], "temperature": 0})
    body = chat_body(req, [{"role": "user", "content": "first"}, {"role": "assistant", "content": "ok"}])
    assert [m["content"] for m in body["messages"]] == ["Be brief.", "first", "ok", "again"]
    assert body["tools"] == [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"},
                                                               "strict": True}}]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert body["max_tokens"] == 5 and body["temperature"] == 0 and body["stream"] is False


@pytest.mark.parametrize("body, param", [
    ({"input": "x", "seed": 1}, "seed"),
    ({"input": "x", "truncation": "auto"}, "truncation"),
    ({"input": "x", "include": ["file_search_call.results"]}, "include"),
    ({"input": "x", "client_metadata": {"turn": 1}}, "client_metadata.turn"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input[0].arguments"),
    ({"input": "x", "tool_choice": {"type": "function", "name": "g"}, "tools": [{"type": "function", "name": "f"}]},
     "tool_choice"),
    ({}, "input"),
])
def test_what_is_not_served_is_refused_naming_the_field(body, param):
    with pytest.raises(OpenAIError) as info:
        chat_body(parse_responses(body), [])
    assert info.value.param == param and info.value.status == 400


def test_codex_clis_request_fields_are_taken_and_change_nothing_of_the_chat_call():
    """What Codex CLI 0.171 sends besides its input and tools: its tags (`client_metadata`), a request
    for encrypted reasoning (there is none: this server returns no reasoning items), an empty
    `reasoning`, `store: false`, a cache key."""
    codex = {"model": "policy", "input": "hi", "stream": True, "tool_choice": "auto", "parallel_tool_calls": True,
             "reasoning": {}, "store": False, "include": ["reasoning.encrypted_content"], "prompt_cache_key": "t-1",
             "client_metadata": {"session_id": "t-1", "turn_id": "u-2"}}
    assert chat_body(parse_responses(codex), []) == chat_body(parse_responses(
        {"model": "policy", "input": "hi", "stream": True, "tool_choice": "auto", "parallel_tool_calls": True}), [])
