"""Tool-call and answer parsing: Hermes blocks, fences, answers; bad text never raises."""

from __future__ import annotations

import pytest

from harnesses.parsing import answers_match, parse_answer, parse_fenced, parse_tool_calls


def test_hermes_blocks_in_order():
    text = ('thinking\n<tool_call>\n{"name": "run_shell", "arguments": {"command": "ls"}}\n</tool_call>'
            '<tool_call>{"name": "lookup", "arguments": "{\\"key\\": \\"a\\"}"}</tool_call>')
    calls, errors = parse_tool_calls(text)
    assert errors == []
    assert [(c.name, c.arguments) for c in calls] == [("run_shell", {"command": "ls"}), ("lookup", {"key": "a"})]


@pytest.mark.parametrize("text,needle", [
    ("<tool_call>{not json}</tool_call>", "not valid JSON"),
    ('<tool_call>{"arguments": {}}</tool_call>', '"name"'),
    ('<tool_call>{"name": "x", "arguments": [1]}</tool_call>', "must be an object"),
    ('<tool_call>{"name": "x"}', "unbalanced"),
])
def test_malformed_calls_become_errors(text, needle):
    calls, errors = parse_tool_calls(text)
    assert calls == [] and any(needle in e for e in errors)


def test_fenced_python_blocks():
    text = "run this\n```python\nprint(1)\n```\nand\n```bash\nls\n```\n```\nprint(2)\n```"
    assert parse_fenced(text) == ["print(1)\n", "print(2)\n"]


@pytest.mark.parametrize("text,expected", [
    ("so the total is\nANSWER: 42", "42"), ("<answer> 7 </answer>", "7"), ("answer: 3.5\n", "3.5"),
    ("no answer here", None), ('<tool_call>{"name":"a"}</tool_call>', None),
])
def test_answers(text, expected):
    assert parse_answer(text) == expected


def test_answers_match_numbers_and_text():
    assert answers_match("42", 42) and answers_match("42.0", 42) and answers_match("1,234", 1234)
    assert not answers_match("41", 42) and not answers_match(None, 42) and not answers_match("x", 42)
    assert answers_match(" done ", "done")


def test_an_answer_line_with_nothing_after_it_is_no_answer():
    from harnesses.parsing import parse_answer

    assert parse_answer("ANSWER: ") is None and parse_answer("ANSWER:\n\n") is None and parse_answer("ANSWER: 7") == "7"
