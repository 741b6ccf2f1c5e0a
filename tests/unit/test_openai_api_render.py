"""OpenAI messages and tools -> prompt ids (engines/openai_api/render.py): the model's own template renders
them as `model.chat.render` does (tools natively or by the fallback), tool-role messages and an
assistant's `tool_calls` reach the template (written into the content for templates that ignore
them), tool_choice decides which tools the template sees and what opening the server writes, and
continue_final_message leaves the assistant's text open."""

from __future__ import annotations

import copy
import json

import pytest

from agentrl_cli.model.chat import render
from agentrl_cli.model.tokenizer import build_tokenizer
from agentrl_cli.engines.openai_api.base import OpenAIError
from agentrl_cli.engines.openai_api.protocol import parse_chat
from agentrl_cli.engines.openai_api.render import hermes_block, render_chat

# SmolLM2-style: no tools, no tool role, no tool_calls
NO_TOOLS = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' "
            "+ '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
TOOL = {"type": "function", "function": {"name": "calculator", "description": "Evaluate an expression.",
                                         "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}}
OTHER = {"type": "function", "function": {"name": "clock", "description": "The time.",
                                          "parameters": {"type": "object", "properties": {}}}}
CALLED = [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "What is 2+3?"},
          {"role": "assistant", "content": None, "tool_calls": [
              {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "2+3"}'}}]},
          {"role": "tool", "tool_call_id": "call_1", "content": '{"result": 5}'}]


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.fixture(scope="module")
def plain_tok():
    t = copy.deepcopy(build_tokenizer())
    t.chat_template = NO_TOOLS
    return t


def rendered(tok, **body):
    return render_chat(tok, parse_chat({"messages": CALLED, **body}))


def text_of(tok, ids) -> str:
    return tok.decode(ids, skip_special_tokens=False)


def test_a_tool_conversation_renders_as_the_chat_renderer_renders_it(tok):
    """The prompt equals model.chat.render of the same conversation (the rollouts' prompt), with the
    assistant's call as the template writes it and the tool result as the template's tool turn."""
    got = rendered(tok, tools=[TOOL])
    expected_msgs = [*CALLED[:2], {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "2+3"}}}]}, CALLED[3]]
    expected = tok.encode(render(tok, expected_msgs, [TOOL], True), add_special_tokens=False)
    assert got.prompt_ids == expected
    text = text_of(tok, got.prompt_ids)
    assert hermes_block("calculator", {"expression": "2+3"}) in text
    assert "<tool_response>\n{\"result\": 5}\n</tool_response>" in text and "- calculator(expression)" in text
    assert text.endswith("<|im_start|>assistant\n") and got.prefix == ""


def test_a_template_without_tools_gets_the_fallback_and_the_calls_in_the_content(plain_tok):
    got = rendered(plain_tok, tools=[TOOL])
    text = text_of(plain_tok, got.prompt_ids)
    assert json.dumps(TOOL) in text and "<tool_call></tool_call>" in text  # the fallback system prompt
    assert hermes_block("calculator", {"expression": "2+3"}) in text  # the call the template would have dropped
    assert "<|im_start|>user\n<tool_response>\n{\"result\": 5}\n</tool_response>" in text


def test_tool_choice_none_hides_the_tools_and_a_named_choice_shows_only_that_tool(tok):
    assert "- calculator(" not in text_of(tok, rendered(tok, tools=[TOOL], tool_choice="none").prompt_ids)
    named = rendered(tok, tools=[TOOL, OTHER], tool_choice={"type": "function", "function": {"name": "clock"}})
    text = text_of(tok, named.prompt_ids)
    assert "- clock()" in text and "- calculator(" not in text
    assert [t["function"]["name"] for t in named.tools] == ["clock"]


def test_a_forced_tool_choice_opens_the_call_for_the_model(tok):
    named = rendered(tok, tools=[TOOL], tool_choice={"type": "function", "function": {"name": "calculator"}})
    assert named.prefix == '<tool_call>\n{"name": "calculator", "arguments": '
    assert text_of(tok, named.prompt_ids).endswith("<|im_start|>assistant\n" + named.prefix)
    required = rendered(tok, tools=[TOOL], tool_choice="required")
    assert required.prefix == "<tool_call>\n" and required.client_prefix == ""


def test_continue_final_message_leaves_the_assistant_text_open(tok):
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "The answer is"}]
    got = render_chat(tok, parse_chat({"messages": messages, "continue_final_message": True}))
    assert text_of(tok, got.prompt_ids).endswith("<|im_start|>assistant\nThe answer is")
    assert got.client_prefix == got.prefix == "The answer is"
    with pytest.raises(OpenAIError) as info:
        render_chat(tok, parse_chat({"messages": messages[:1], "continue_final_message": True}))
    assert info.value.param == "continue_final_message"


def test_text_parts_and_developer_messages_render_as_text_and_system(tok):
    parts = [{"role": "developer", "content": "Be brief."},
             {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    got = render_chat(tok, parse_chat({"messages": parts}))
    plain = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "a\nb"}]
    assert got.prompt_ids == tok.encode(render(tok, plain, None, True), add_special_tokens=False)


@pytest.mark.parametrize("message,param", [
    ({"role": "wizard", "content": "x"}, "messages[0].role"),
    ({"role": "user"}, "messages[0].content"),
    ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}, "messages[0].content[0].type"),
    ({"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{oops"}}]},
     "messages[0].tool_calls[0].function.arguments"),
])
def test_a_bad_message_is_refused_naming_where(tok, message, param):
    with pytest.raises(OpenAIError) as info:
        render_chat(tok, parse_chat({"messages": [message]}))
    assert info.value.param == param and info.value.status == 400


def test_the_stop_ids_are_the_templates_end_of_turn_and_eos(tok):
    got = rendered(tok)
    assert tok.convert_tokens_to_ids("<|im_end|>") in got.stop_ids
