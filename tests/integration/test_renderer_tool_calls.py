"""The rollout hands a harness the tool calls the model's chat renderer parsed (`Action.tool_calls`);
what the harness answers is the same as when it parses the text itself, for every built-in harness,
valid and malformed actions alike."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from harnesses.base import Action
from harnesses.contract import INVALID_TEXTS
from harnesses.oracle import oracle_action
from harnesses.registry import resolve
from harnesses.sandboxed import function_tool
from harnesses.tasks import HARNESS_FAMILIES, load_tasks
from agentrl_cli.model.chat import ChatRenderer
from tests.integration.conftest import needs_bwrap

pytestmark = [pytest.mark.integration, needs_bwrap]


def test_the_renderer_reads_hermes_calls_and_none_without_tools(random_model_dir):
    tok = AutoTokenizer.from_pretrained(random_model_dir)
    text = 'Let me check.\n<tool_call>\n{"name": "run_shell", "arguments": {"command": "ls"}}\n</tool_call>'
    tools = [function_tool("run_shell", "Run a command.", {"command": {"type": "string"}}, ["command"])]
    calls = ChatRenderer(tok, "sys", tools).tool_calls(text)
    assert [(c.name, c.arguments) for c in calls] == [("run_shell", {"command": "ls"})]
    assert ChatRenderer(tok, "sys", []).tool_calls(text) == []
    assert ChatRenderer(tok, "sys", tools).tool_calls("<tool_call>{oops</tool_call>") == []


def _calls(obs) -> list[tuple]:
    return [(c.name, c.arguments, c.status, c.exit_code, c.output) for c in obs.calls]  # all but the latency


@pytest.mark.parametrize("name", sorted(HARNESS_FAMILIES))
def test_a_harness_answers_the_renderers_calls_as_it_answers_the_text(name, random_model_dir):
    tok = AutoTokenizer.from_pretrained(random_model_dir)
    own, given = resolve(name)(), resolve(name)()
    chat = ChatRenderer(tok, own.system_prompt(), own.tools())
    try:
        for family in HARNESS_FAMILIES[name]:
            task = load_tasks(name, "train", family)[0]
            texts = [t for turn in range(8) if (t := oracle_action(task, turn)) is not None]
            texts += [texts[0] + "\n<tool_call>{oops</tool_call>", *INVALID_TEXTS]  # a valid call beside a malformed one
            first = (own.reset(task), given.reset(task))
            assert first[0].text == first[1].text
            for text in texts:
                a = own.step(Action(text=text))
                b = given.step(Action(text=text, tool_calls=chat.tool_calls(text)))
                assert (a.text, a.status, a.done, a.info) == (b.text, b.status, b.done, b.info), text
                assert _calls(a) == _calls(b), text
                if a.done:
                    own.reset(task), given.reset(task)
    finally:
        own.close()
        given.close()
