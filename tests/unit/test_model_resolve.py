"""model.path resolution: built-in names, real directories, clear errors."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from agentrl_cli.core.errors import ConfigError, NotFoundError
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


def test_tokenizer_round_trips_any_text_and_keeps_tool_call_tags():
    tok = build_tokenizer()
    text = 'héllo <tool_call>\n{"name": "x", "arguments": {}}\n</tool_call> 世界 \x00\t1234567'
    ids = tok(text)["input_ids"]
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert tok.convert_tokens_to_ids("<tool_call>") in ids


def test_what_an_agent_copies_is_the_same_single_token_wherever_it_appears():
    tok = build_tokenizer()
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    for n in (0, 7, 67, 352, 999):
        (one,) = enc(str(n))
        assert enc(f"{n}\n")[0] == one and enc(f"ANSWER: {n}")[-1] == one and one in enc(f"value of {n} + 1.")
    assert enc("grep -cw alpha notes.txt")[3] in enc("the word alpha?")
    prompt, command = enc("Compute the value of 46 + 13."), enc("echo $(( 46 + 13 ))")
    assert command[2:5] == prompt[5:8] == enc("46 + 13")


def test_committed_tokenizer_matches_its_training_recipe():
    from agentrl_cli.model.tokenizer import TOKENIZER_FILE, corpus, train_tokenizer

    trained = train_tokenizer(corpus()).to_str()
    assert trained == Tokenizer.from_file(str(TOKENIZER_FILE)).to_str(), \
        "regenerate: python -m agentrl_cli.model.tokenizer (and bump model.tiny.RECIPE_VERSION)"


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
