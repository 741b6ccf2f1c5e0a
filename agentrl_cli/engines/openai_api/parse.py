"""A generated assistant turn -> OpenAI `content` + `tool_calls`, in the model's convention: Hermes
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks, each read by
`harnesses.parsing.parse_tool_calls` (the parser the harnesses use, so a call the API returns is
the call a harness would have run).

The turn is read from its start: the prefix already in the prompt (the client's continued text, a
forced tool-call opening), then the generated text; a call opened in the prompt and closed by the
model is one call. A block becomes a call when it parses and names a tool the request offered
(the named one, for a named `tool_choice`); `parallel_tool_calls: false` keeps the first. Every
other block (malformed JSON, an unknown name, an unclosed tag) stays in `content`, where the
agent can see what went wrong, and is named in `rejected` (one reason each) when the model wrote
it: it ends past the prompt's prefix (a block wholly in the client's own text is not the model's).
A valid block left out by `parallel_tool_calls: false` is not rejected. `content` is the turn's
text from the end of the client's own prefix, the accepted blocks cut out (whitespace-trimmed when
any were).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

from harnesses.parsing import parse_tool_calls

_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
UNCLOSED = "a <tool_call> block never closed"  # the reason of a rejected block cut off before its end


@dataclass
class ParsedTurn:
    content: str
    tool_calls: list[dict]  # OpenAI tool call objects (id "call_<24 hex>", index, type, function)
    rejected: list[str] = field(default_factory=list)  # why each block the model wrote is not a call


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def parse_turn(generated: str, *, prefix: str = "", visible_from: int = 0, tool_names: set[str] | None = None,
               parallel: bool = True) -> ParsedTurn:
    """`generated` after `prefix`; `visible_from`: how much of the prefix the client wrote itself
    (left out of `content`); `tool_names`: the offered tools (None: no parsing, all is content)."""
    full = prefix + generated
    if not tool_names:
        return ParsedTurn(full[visible_from:], [])
    calls, spans, rejected = [], [], []
    blocks = list(_BLOCK.finditer(full))
    for m in blocks:
        parsed, errors = parse_tool_calls(m.group(0))
        if not parsed or parsed[0].name not in tool_names:
            if m.end() > len(prefix):
                rejected.append(errors[0].replace("tool call 1", "a tool call") if errors else
                                f"a tool call names {parsed[0].name!r}, which the request did not offer")
            continue
        if calls and not parallel:
            continue
        call = parsed[0]
        calls.append({"id": call_id(), "index": len(calls), "type": "function",
                      "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)}})
        spans.append(m.span())
    if "<tool_call>" in full[blocks[-1].end() if blocks else 0:] and len(full) > len(prefix):
        rejected.append(UNCLOSED)
    if not calls:
        return ParsedTurn(full[visible_from:], [], rejected)
    kept, at = [], visible_from
    for start, end in spans:
        if end > at:
            kept.append(full[at:max(at, start)])
            at = end
    kept.append(full[at:])
    return ParsedTurn("".join(kept).strip(), calls, rejected)
