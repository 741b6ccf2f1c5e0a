"""Which ids a session's next chat call is generated from: the token-exact continuation of an earlier
call when the agent sent its history back unchanged, else the chat template's render.

An OpenAI agent sends the whole conversation every call: the earlier messages, the assistant
message it was given (as returned), then tool results or a user turn. The chat template renders
that assistant turn from its text, which need not give back the ids the model sampled (a tokenizer
splits the decoded text its own way, a template reformats tool-call JSON or trims whitespace). So
when the new messages are the previous call's messages, then the assistant message of one of its
choices, then more, the prompt is spliced as AReaL's proxy and verifiers do:

    previous prompt ids + the choice's generated ids (+ the end-of-turn token when the generation
    was cut by length or by a stop string) + the template's render of what follows the assistant turn

where "what follows" is the render's ids after the end-of-turn token that closes the assistant
turn (found by counting end-of-turn tokens: the previous render holds e of them, the new one's
(e+1)-th closes the assistant turn; special tokens are never merged with their neighbours, so the
ids after it are the render of the new messages alone; an assistant message whose text encodes to
the end-of-turn token itself is not spliced). The model is then shown its own history as
sampled: the call's ids extend the previous call's ids + generated ids, and the session records one
segment. When the template's render already reproduces the generated ids, it is used as is
(`rerender_exact`, measured per call: `gateway/rerender_exact_calls` and
`gateway/rerender_mismatch_calls`). A template that renders earlier turns differently once later
ones follow (Qwen3 drops earlier reasoning) is not followed there: a spliced prompt keeps the
history as it was sampled, which is also what training scores.

A call whose messages rewrite the history (an earlier message dropped or edited, the assistant
message changed) is generated from the template's render, honestly: it extends nothing, so it
starts a new segment (`record.py` counts it).

Belongs here: message normalization, matching a call to the choice it continues, the splice.
Not here: recording and stitching (`record.py`), HTTP (`app.py`), rendering (`openai_api`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


def _text(content: Any) -> str:
    """A message's content as text: None is "", a list of parts is their text joined."""
    if content is None:
        return ""
    if isinstance(content, list):
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return str(content)


def _arguments(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _calls(message: dict) -> list[tuple[str, Any]]:
    out = []
    for c in message.get("tool_calls") or []:
        fn = (c or {}).get("function") or {}
        out.append((fn.get("name", ""), _arguments(fn.get("arguments", ""))))
    return out


def norm_message(message: Any) -> tuple:
    """What of a message the chat template renders, in a comparable form: role, content as text,
    tool calls (name, parsed arguments), tool_call_id and name; keys the SDK echoes as null
    (`refusal`, `audio`, `annotations`, ...) do not count."""
    if not isinstance(message, dict):
        return ("?", repr(message))
    return (message.get("role"), _text(message.get("content")), tuple((n, json.dumps(a, sort_keys=True))
            for n, a in _calls(message)), message.get("tool_call_id") or "", message.get("name") or "")


def context_key(body: dict) -> str:
    """What besides the messages changes the render: the tools, tool_choice (which tools the template
    sees) and chat_template_kwargs."""
    return json.dumps([body.get(k) or None for k in ("tools", "tool_choice", "chat_template_kwargs")],
                      sort_keys=True, default=str)


@dataclass
class LastCall:
    """A segment's latest call, the point its next call may continue."""

    messages: list[tuple]  # norm_message of each message sent
    context: str  # context_key of the request
    rendered: list[int]  # the template's render of `messages` (with the generation prompt)
    replies: list[tuple]  # norm_message of each choice's returned assistant message
    choices: list  # the openai_api Completions still open (choice index -> Completion), in order
    indices: list[int] = field(default_factory=list)  # the choice index of each entry of `choices`


@dataclass
class Plan:
    """The ids one call is generated from, and what they continue."""

    sent: list[int]
    tip: Any = None  # the open segment whose last call this call continues by its messages
    choice: int | None = None  # position in tip.last.choices of the choice continued
    spliced: bool = False  # sent = previous ids + generated ids + the rendered delta
    rerender_exact: bool | None = None  # the template re-rendered the generated ids exactly (None: nothing to compare)
    observation: list[dict] = field(default_factory=list)  # the messages after the continued assistant turn


def continued_choice(last: LastCall, messages: list[tuple], context: str) -> int | None:
    """The position of the choice of `last` that `messages` continue (its messages, then that
    choice's assistant message, then at least one more), or None."""
    k = len(last.messages)
    if context != last.context or len(messages) <= k + 1 or messages[:k] != last.messages:
        return None
    for pos, reply in enumerate(last.replies):
        if messages[k] == reply:
            return pos
    return None


def splice(prefix: list[int], generated: list[int], last_rendered: list[int], rendered: list[int],
           end_of_turn: int, stop_ids: tuple[int, ...]) -> list[int] | None:
    """prefix + generated (+ end_of_turn) + the ids of `rendered` after the turn that follows
    `last_rendered`; None when `rendered` has no such turn (a template that renders no end-of-turn
    token after an assistant message)."""
    closed = last_rendered.count(end_of_turn)
    seen = 0
    for at, tok in enumerate(rendered):
        if tok == end_of_turn:
            seen += 1
            if seen == closed + 1:
                delta = rendered[at + 1:]
                closing = [] if generated and generated[-1] in stop_ids else [end_of_turn]
                return list(prefix) + list(generated) + closing + delta if delta else None
    return None


def writes_end_of_turn(tokenizer, message: dict, end_of_turn: int) -> bool:
    """Whether the text of an assistant message (content, tool-call names and arguments) encodes to
    the end-of-turn token itself (a model that spelled `<|im_end|>` out in ordinary tokens): counting
    end-of-turn tokens would then find the wrong turn, so such a call is not spliced."""
    text = _text(message.get("content")) + "".join(f"{n}{a if isinstance(a, str) else json.dumps(a)}"
                                                   for n, a in _calls(message))
    return end_of_turn in tokenizer.encode(text, add_special_tokens=False)


def plan_call(tips: list, body: dict, rendered: list[int], tokenizer, end_of_turn: int, stop_ids: tuple[int, ...]) -> Plan:
    """The Plan of a call with request `body` whose messages the template rendered as `rendered`.
    `tips`: the session's open segments, newest first (each with `.ids`, the ids up to its last
    call's prompt, and `.last`, a LastCall)."""
    messages = [norm_message(m) for m in body.get("messages") or []]
    context = context_key(body)
    for tip in tips:
        pos = continued_choice(tip.last, messages, context)
        if pos is None:
            continue
        generated = list(tip.last.choices[pos].output_ids)
        history = tip.ids + generated
        observation = list(body["messages"][len(tip.last.messages) + 1:])
        if rendered[:len(history)] == history:
            return Plan(rendered, tip, pos, spliced=False, rerender_exact=True, observation=observation)
        assistant = body["messages"][len(tip.last.messages)]
        sent = None if writes_end_of_turn(tokenizer, assistant, end_of_turn) else \
            splice(tip.ids, generated, tip.last.rendered, rendered, end_of_turn, stop_ids)
        if sent is not None:
            return Plan(sent, tip, pos, spliced=True, rerender_exact=False, observation=observation)
        return Plan(rendered, rerender_exact=False)
    return Plan(list(rendered))
