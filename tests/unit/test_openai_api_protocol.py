"""Validation of OpenAI-compatible requests (engines/openai_api/protocol.py): an unknown field and a known
but unimplemented one are refused with OpenAI's error object naming the field; ranges follow
SGLang's; a request maps to the SGLang sampling params the engine honours."""

from __future__ import annotations

import pytest

from agentrl_cli.engines.openai_api.base import OpenAIError
from agentrl_cli.engines.openai_api.protocol import parse_chat, parse_completion, sampling_params

MESSAGES = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "calculator", "parameters": {"type": "object", "properties": {}}}}


def refusal(body: dict, parse=parse_chat) -> OpenAIError:
    with pytest.raises(OpenAIError) as info:
        parse(body)
    return info.value


def test_an_unknown_field_is_refused_naming_it():
    err = refusal({"messages": MESSAGES, "frobnicate": True})
    assert err.status == 400 and err.param == "frobnicate" and err.code == "unknown_parameter"
    assert "Unrecognized request argument supplied: frobnicate" in err.message
    body = err.body()["error"]
    assert set(body) == {"message", "type", "param", "code"} and body["type"] == "invalid_request_error"


@pytest.mark.parametrize("field,value", [("logit_bias", {"12": 5}), ("response_format", {"type": "json_object"}),
                                         ("functions", [{"name": "f"}]), ("reasoning_effort", "high"),
                                         ("store", True), ("return_hidden_states", True)])
def test_a_known_field_the_server_does_not_implement_is_refused_with_what_to_do(field, value):
    err = refusal({"messages": MESSAGES, field: value})
    assert err.param == field and err.code == "unsupported_parameter"
    assert f"{field}=" in err.message and "not supported" in err.message


@pytest.mark.parametrize("field,value", [("logit_bias", None), ("response_format", {"type": "text"}), ("store", False),
                                         ("return_hidden_states", False), ("service_tier", "auto"),
                                         ("modalities", ["text"])])
def test_unimplemented_fields_at_their_defaults_are_accepted(field, value):
    """What the SGLang router and SDKs send by default must pass (the router adds return_hidden_states=false)."""
    parse_chat({"messages": MESSAGES, field: value})


def test_what_the_sglang_router_forwards_is_accepted():
    body = {"messages": MESSAGES, "model": "m", "logprobs": False, "max_completion_tokens": 4, "stream": False,
            "temperature": 0.0, "no_stop_trim": False, "ignore_eos": False, "continue_final_message": False,
            "skip_special_tokens": True, "separate_reasoning": True, "stream_reasoning": True,
            "return_hidden_states": False}
    assert parse_chat(body).max_completion_tokens == 4
    parse_completion({"model": "m", "prompt": "hi", "max_tokens": 3, "stream": False, "echo": False,
                      "no_stop_trim": False, "ignore_eos": False, "skip_special_tokens": True,
                      "return_hidden_states": False})


@pytest.mark.parametrize("body,param", [
    ({"temperature": -0.1}, "temperature"), ({"top_p": 0}, "top_p"), ({"n": 0}, "n"), ({"max_tokens": 0}, "max_tokens"),
    ({"top_logprobs": 2}, "top_logprobs"), ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"stop": ["x", ""]}, "stop"), ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "other"}}}, "tool_choice"),
    ({"temperature": "hot"}, "temperature"), ({"messages": []}, "messages"), ({"tools": [{"type": "function"}]},
                                                                               "tools[0].function"),
])
def test_out_of_range_or_mistyped_values_name_the_field(body, param):
    assert refusal({"messages": MESSAGES, **body}).param == param


def test_a_missing_field_is_named():
    err = refusal({"model": "m"})
    assert err.param == "messages" and err.code == "missing_required_parameter"
    assert refusal({"max_tokens": 3}, parse_completion).param == "prompt"


def test_tool_choice_defaults_to_auto_with_tools_else_none():
    assert parse_chat({"messages": MESSAGES}).choice == "none"
    assert parse_chat({"messages": MESSAGES, "tools": [TOOL]}).choice == "auto"
    named = parse_chat({"messages": MESSAGES, "tools": [TOOL],
                        "tool_choice": {"type": "function", "function": {"name": "calculator"}}})
    assert named.choice == "named" and named.forced_name == "calculator"


def test_a_chat_request_maps_to_sglang_sampling_params():
    req = parse_chat({"messages": MESSAGES, "temperature": 0, "top_p": 0.9, "stop": "END", "seed": 7,
                      "stop_token_ids": [5], "max_completion_tokens": 12})
    sampling = sampling_params(req, [2, 5], max_tokens=req.max_completion_tokens)
    assert sampling == {"max_new_tokens": 12, "temperature": 0.0, "top_p": 0.9, "top_k": -1, "min_p": 0.0,
                        "frequency_penalty": 0.0, "presence_penalty": 0.0, "stop": ["END"],
                        "stop_token_ids": [5, 2], "sampling_seed": 7}


def test_unset_sampling_fields_take_openai_defaults_and_no_length_limit():
    sampling = sampling_params(parse_chat({"messages": MESSAGES}))
    assert sampling["max_new_tokens"] is None and sampling["temperature"] == 1.0 and "stop_token_ids" not in sampling
    assert parse_completion({"prompt": "hi"}).max_tokens == 16  # SGLang's completions default
