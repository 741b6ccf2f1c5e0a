"""Parse actions out of model text: Hermes-style tool calls (what Qwen-family chat templates emit),
fenced code blocks, and final answers; and write a Hermes call (`tool_call`, for scripted solutions). Nothing here raises on bad text: problems come back as
error strings so the harness can answer with an `invalid_action` observation.

    <tool_call>
    {"name": "run_shell", "arguments": {"command": "wc -l log.txt"}}
    </tool_call>
"""

from __future__ import annotations

import json
import re

from harnesses.base import Action, ToolCall

_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
_FENCE = re.compile(r"```(\w+)?[ \t]*\n(.*?)```", re.S)
_ANSWER = re.compile(r"(?:^|\n)\s*ANSWER:\s*(.+?)\s*$", re.S | re.I)
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S)


def tool_call(name: str, **arguments) -> str:
    """A Hermes-style tool call block, as a model writes it."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def parse_tool_calls(text: str) -> tuple[list[ToolCall], list[str]]:
    """Hermes-style calls in order, and one error message per malformed block."""
    calls: list[ToolCall] = []
    errors: list[str] = []
    for i, m in enumerate(_TOOL_CALL.finditer(text)):
        body = m.group(1).strip()
        try:
            data = json.loads(body)
        except ValueError as exc:
            errors.append(f"tool call {i + 1} is not valid JSON ({exc.msg} at char {exc.pos})")
            continue
        if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not data["name"]:
            errors.append(f'tool call {i + 1} needs {{"name": "...", "arguments": {{...}}}}')
            continue
        args = data.get("arguments", {})
        if isinstance(args, str):  # some templates emit arguments as a JSON string
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                errors.append(f"tool call {i + 1}: arguments is a string that is not JSON")
                continue
        if not isinstance(args, dict):
            errors.append(f"tool call {i + 1}: arguments must be an object")
            continue
        calls.append(ToolCall(name=data["name"], arguments=args, id=f"call_{i}"))
    opened, closed = text.count("<tool_call>"), text.count("</tool_call>")
    if opened != closed:
        errors.append("unbalanced <tool_call> tags")
    return calls, errors


def action_calls(action: Action) -> tuple[list[ToolCall], list[str]]:
    """The calls of an action (those the model's chat renderer parsed, `action.tool_calls`, when
    given; else the Hermes calls of its text) and the errors of its text's malformed blocks."""
    calls, errors = parse_tool_calls(action.text)
    return (list(action.tool_calls) if action.tool_calls else calls), errors


def parse_fenced(text: str, languages: tuple[str, ...] = ("python", "py")) -> list[str]:
    """Bodies of fenced code blocks in the given languages (an unlabelled fence counts too)."""
    return [m.group(2) for m in _FENCE.finditer(text) if (m.group(1) or "").lower() in languages + ("",)]


def parse_answer(text: str) -> str | None:
    """The final answer: `<answer>X</answer>` or a last line `ANSWER: X`; None when absent."""
    tag = _ANSWER_TAG.findall(text)
    if tag:
        return tag[-1].strip()
    text_wo_calls = _TOOL_CALL.sub("", text)
    m = _ANSWER.search(text_wo_calls)
    lines = m.group(1).strip().splitlines() if m else []
    return lines[0].strip() if lines else None  # "ANSWER:" with nothing after it is no answer


def answers_match(given: str | None, expected) -> bool:
    """Numeric answers compare as numbers (1e-6 relative), others as trimmed text."""
    if given is None:
        return False
    if isinstance(expected, (int, float)) and not isinstance(expected, bool):
        try:
            value = float(given.replace(",", "").strip().rstrip("."))
        except ValueError:
            return False
        return abs(value - expected) <= 1e-6 * max(1.0, abs(expected))
    return given.strip() == str(expected).strip()
