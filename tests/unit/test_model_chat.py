"""The model's own chat conventions (model/chat.py): tool support detected by rendering, the
system-prompt fallback for templates without tools, stop tokens (eos, generation-config eos and the
end-of-turn token), token deltas that reproduce a fresh render, and mismatch counting for a
template that does not round-trip."""

from __future__ import annotations

import copy

import pytest
from transformers import AutoTokenizer

from agentrl_cli.model.chat import ChatRenderer, TokenExact, chat_format, check_episode, render, strip_stops, token_mismatches

# SmolLM2-135M-Instruct's template: no tools, every role rendered as <|im_start|>ROLE.
NO_TOOLS = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\n"
            "You are a helpful AI assistant<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
            "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
# Ends an assistant turn with <|endoftext|>, not with the tokenizer's eos (<|im_end|>).
OTHER_END = NO_TOOLS.replace("message['content'] + '<|im_end|>'", "message['content'] + ('<|endoftext|>' if message['role'] == "
                             "'assistant' else '<|im_end|>')")
# Lossy: trims the assistant's text, so trailing whitespace the model generated is lost on re-render.
TRIMS = NO_TOOLS.replace("message['content']", "(message['content'] | trim)")
# Rewrites history: earlier assistant turns are shortened to "[...]" once a later message follows.
REWRITES = NO_TOOLS.replace("message['content'] + '<|im_end|>'", "(message['content'] if message['role'] != 'assistant' or "
                            "loop.last else '[...]') + '<|im_end|>'")

TOOL = {"type": "function", "function": {"name": "calculator", "description": "Evaluate an expression.",
                                         "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}}
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call>'


@pytest.fixture(scope="module")
def base_tok(random_model_dir):
    return AutoTokenizer.from_pretrained(random_model_dir)


def with_template(tok, template: str):
    t = copy.deepcopy(tok)
    t.chat_template = template
    return t


def episode(tok, answers: list[str], tools=(TOOL,)) -> tuple[list[int], ChatRenderer]:
    """Ids kept as rollouts keep them: prompt, each answer's ids plus the end token, the reply deltas."""
    chat = ChatRenderer(tok, "You are an agent.", list(tools))
    ids = chat.first_prompt("What is 2+3?")
    for i, text in enumerate(answers):
        out = tok.encode(text, add_special_tokens=False) + [chat.eos]
        ids += out
        chat.generated(out, text, closed=False)
        if i < len(answers) - 1:
            ids += chat.reply(text, '{"result": 5}')
        else:
            chat.finish(text)
    return ids, chat


def test_the_built_in_template_takes_tools_natively_and_round_trips(base_tok):
    fmt = chat_format(base_tok)
    assert fmt.native_tools and fmt.tool_role
    assert fmt.stop_ids == (base_tok.convert_tokens_to_ids("<|im_end|>"),)
    text = render(base_tok, [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}], [TOOL], True)
    assert "calculator(expression)" in text and "<tools>" not in text
    ids, chat = episode(base_tok, [CALL, "ANSWER: 5"])
    assert check_episode(ids, chat) == TokenExact(0, 0, len(ids))


def test_a_template_without_tools_gets_the_system_prompt_fallback(base_tok):
    tok = with_template(base_tok, NO_TOOLS)
    fmt = chat_format(tok)
    assert not fmt.native_tools
    ids, chat = episode(tok, [CALL, "ANSWER: 5"])
    text = tok.decode(ids)
    system = text.split("<|im_end|>")[0]
    assert '"name": "calculator"' in system and "<tool_call>" in system and "<tools>" in system
    assert "<|im_start|>user\n<tool_response>\n{\"result\": 5}\n</tool_response><|im_end|>" in text
    assert "<|im_start|>tool" not in text  # a template with no tools has never seen a tool role
    assert check_episode(ids, chat) == TokenExact(0, 0, len(ids))


def test_stop_ids_hold_eos_generation_eos_and_the_end_of_turn_token(base_tok):
    tok = with_template(base_tok, OTHER_END)
    end, eos = tok.convert_tokens_to_ids("<|endoftext|>"), tok.eos_token_id
    fmt = chat_format(tok, generation_eos=[7])
    assert fmt.end_of_turn == end and end != eos
    assert fmt.stop_ids == (end, eos, 7)
    assert strip_stops([5, 6, end, eos], fmt) == [5, 6] and strip_stops([5, 6], fmt) == [5, 6]
    ids, chat = episode(tok, [CALL, "ANSWER: 5"])
    assert ids.count(end) == 2  # each assistant turn closed by the template's own end token
    assert chat.eos == end
    assert check_episode(ids, chat) == TokenExact(0, 0, len(ids))


@pytest.mark.parametrize("template,answers", [(TRIMS, [CALL + "\n\n", "ANSWER: 5  \n"]), (REWRITES, [CALL, "ANSWER: 5"])],
                         ids=["trims-text", "rewrites-history"])
def test_a_lossy_template_is_counted_not_hidden(base_tok, template, answers):
    tok = with_template(base_tok, template)
    ids, chat = episode(tok, answers)
    found = check_episode(ids, chat)
    assert found.mismatches > 0 and found.retokenized == 0


def test_generated_tokens_split_unlike_the_tokenizer_are_counted_apart(base_tok):
    chat = ChatRenderer(base_tok, "You are an agent.", [TOOL])
    ids = chat.first_prompt("What is 2+3?")
    text = "ANSWER: 5"
    out = [i for ch in text for i in base_tok.encode(ch, add_special_tokens=False)] + [chat.eos]  # one token a character
    assert out[:-1] != base_tok.encode(text, add_special_tokens=False)
    ids += out
    chat.generated(out, text, closed=False)
    chat.finish(text)
    found = check_episode(ids, chat)
    assert found.mismatches == 0 and found.retokenized > 0


def test_mismatch_counting():
    assert token_mismatches([1, 2, 3, 4], [1, 2, 3, 4, 9]) == 0  # what the fresh render adds at the end is not counted
    assert token_mismatches([1, 2, 3, 4], [1, 2, 8, 4]) == 1
    assert token_mismatches([1, 2, 3, 4], [1, 2, 4]) == 1
    assert token_mismatches([], [1]) == 0


def test_a_tokenizer_without_a_template_is_refused(base_tok):
    tok = with_template(base_tok, None)
    with pytest.raises(ValueError, match="no chat template"):
        chat_format(tok)
