"""model.path resolution: built-in names, real directories, clear errors."""

from __future__ import annotations

import pytest

from agentrl_cli.errors import ConfigError, NotFoundError
from agentrl_cli.model.resolve import builtin_dir, resolve_model_path
from agentrl_cli.model.tokenizer import build_tokenizer


def test_unknown_builtin_lists_the_known_ones(tmp_path):
    with pytest.raises(ConfigError) as info:
        resolve_model_path("builtin:huge", str(tmp_path))
    assert "builtin:tiny-agent" in info.value.hint


def test_missing_directory_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError) as info:
        resolve_model_path(str(tmp_path / "nope"), str(tmp_path))
    assert "config.json" in info.value.message


def test_unbuilt_builtin_says_how_to_build(tmp_path):
    with pytest.raises(NotFoundError) as info:
        resolve_model_path("builtin:tiny-agent", str(tmp_path), build=False)
    assert "agentrl model build-tiny" in info.value.hint
    assert builtin_dir(str(tmp_path)).parent == tmp_path / "models"


def test_byte_tokenizer_round_trips_and_keeps_tool_call_tags():
    tok = build_tokenizer()
    text = 'héllo <tool_call>\n{"name": "x", "arguments": {}}\n</tool_call> 世界'
    ids = tok(text)["input_ids"]
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert all(i < 256 for i in tok("plain bytes only")["input_ids"])


def test_chat_template_renders_tools_tool_calls_and_tool_results():
    tok = build_tokenizer()
    tools = [{"type": "function", "function": {"name": "run_shell", "description": "Run.", "parameters": {"type": "object", "properties": {"command": {}}}}}]
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
            {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "run_shell", "arguments": {"command": "ls"}}}]},
            {"role": "tool", "content": "out"}]
    text = tok.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=True)
    assert "- run_shell(command): Run." in text
    assert '<tool_call>\n{"name": "run_shell", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>' in text
    assert "<tool_response>\nout\n</tool_response>" in text and text.endswith("<|im_start|>assistant\n")
