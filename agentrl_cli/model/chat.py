"""A model's own chat conventions, read from its tokenizer: how its chat template renders a
conversation (with tools where the template supports them), which tokens end a turn, and the
token deltas of a growing conversation (`ChatRenderer`).

Tools: a template that renders the `tools=` argument gets the tool schemas that way. A template
that ignores them (SmolLM2's, Llama-2 style ones) gets the documented fallback: the schemas and
the Hermes `<tool_call>` convention appended to the system prompt (`FALLBACK_TOOLS`), and tool
results sent back as a user turn wrapped in `<tool_response>` (the Qwen2.5 convention), since such
templates know no `tool` role. A generated turn's tool calls are read in the Hermes `<tool_call>`
format either way (`ChatRenderer.tool_calls`, the calls the rollout hands a harness as
`Action.tool_calls`); a template whose model emits another format needs its parser here.

Stop tokens: the tokenizer's eos, the model's generation config eos ids, and the token the template
closes an assistant turn with (`<|im_end|>`, `<|eot_id|>`, `<end_of_turn>`...), found by rendering.

Token-exact episodes: `ChatRenderer` never re-tokenizes the whole text; `check_episode` counts the
tokens of an episode that a fresh render of the same conversation does not reproduce (`TokenExact`:
the template's mismatches apart from generated tokens the tokenizer would split differently), so a
template that does not round-trip is seen rather than silently trained on.
"""

from __future__ import annotations

import difflib
import json
import weakref
from dataclasses import dataclass

from agentrl_cli.core.episode import ToolCall
from harnesses.parsing import parse_tool_calls

PROBE_TOOL = {"type": "function", "function": {"name": "agentrl_probe_tool_7f3a", "description": "probe",
                                                "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}}
PROBE_TEXT = "agentrl-probe-content-51c2"

FALLBACK_TOOLS = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within <tool_call></tool_call> "
    "XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n</tool_call>"
)

_FORMATS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class ChatFormat:
    """What a tokenizer's chat template does, found once per tokenizer (`chat_format`)."""

    native_tools: bool  # the template renders `tools=`; else the system-prompt fallback
    tool_role: bool  # the template renders a `tool` message; else tool results go in a user turn
    end_of_turn: int  # the token closing an assistant turn (appended when a generation is cut by length)
    stop_ids: tuple[int, ...]  # eos ids, generation-config eos ids and the end-of-turn token

    def describe(self, tokenizer) -> dict:
        return {"tools": "native (apply_chat_template tools=)" if self.native_tools else
                "fallback (schemas and <tool_call> convention in the system prompt)",
                "tool_role": self.tool_role, "end_of_turn": tokenizer.convert_ids_to_tokens(self.end_of_turn),
                "stop_ids": list(self.stop_ids), "stop_tokens": tokenizer.convert_ids_to_tokens(list(self.stop_ids))}


def chat_format(tokenizer, generation_eos: list[int] | None = None) -> ChatFormat:
    """The tokenizer's ChatFormat (cached per tokenizer object). `generation_eos`: extra eos ids of the
    model's generation config (read from the tokenizer's directory when not given)."""
    try:
        return _FORMATS[tokenizer]
    except (KeyError, TypeError):
        pass
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the tokenizer has no chat template; import the model with --chat-template FILE")
    native = _renders(tokenizer, [{"role": "user", "content": "hi"}], [PROBE_TOOL], PROBE_TOOL["function"]["name"])
    tool_role = _renders(tokenizer, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"},
                                     {"role": "tool", "content": PROBE_TEXT}], None, PROBE_TEXT)
    end = end_of_turn_id(tokenizer)
    if generation_eos is None:
        generation_eos = _generation_eos(tokenizer)
    stops = [end]
    for i in [getattr(tokenizer, "eos_token_id", None), *generation_eos]:
        if isinstance(i, int) and i not in stops:
            stops.append(i)
    fmt = ChatFormat(native_tools=native, tool_role=tool_role and native, end_of_turn=end, stop_ids=tuple(stops))
    try:
        _FORMATS[tokenizer] = fmt
    except TypeError:
        pass
    return fmt


def _renders(tokenizer, messages, tools, needle: str) -> bool:
    try:
        text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=False)
    except Exception:  # noqa: BLE001 - a template that raises on this input does not support it
        return False
    return needle in text


def end_of_turn_id(tokenizer) -> int:
    """The first special token the template writes after an assistant's content; the eos token
    when the template writes none."""
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": PROBE_TEXT}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    at = text.rfind(PROBE_TEXT)
    special = set(getattr(tokenizer, "all_special_ids", []) or []) | set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    if at >= 0:
        for i in tokenizer.encode(text[at + len(PROBE_TEXT):], add_special_tokens=False):
            if i in special:
                return i
    if tokenizer.eos_token_id is None:
        raise ValueError("the chat template closes an assistant turn with no special token and the tokenizer has no eos token")
    return tokenizer.eos_token_id


def _generation_eos(tokenizer) -> list[int]:
    path = getattr(tokenizer, "name_or_path", "") or ""
    try:
        data = json.loads(open(f"{path}/generation_config.json", encoding="utf-8").read())
    except (OSError, ValueError):
        return []
    value = data.get("eos_token_id")
    return [value] if isinstance(value, int) else [v for v in (value or []) if isinstance(v, int)]


def fallback_system(system: str, tools: list[dict]) -> str:
    """The system prompt with tool schemas and the Hermes `<tool_call>` convention appended."""
    return system + FALLBACK_TOOLS.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))


def prepare(fmt: ChatFormat, messages: list[dict], tools: list[dict] | None) -> tuple[list[dict], list[dict] | None]:
    """(messages, tools) to hand to apply_chat_template under `fmt`: the fallback moves tools into
    the system prompt and tool results into user turns."""
    if not tools or fmt.native_tools:
        out = messages if fmt.tool_role else [_as_user(m) for m in messages]
        return out, (tools or None)
    out = [_as_user(m) for m in messages]
    if out and out[0]["role"] == "system":
        out[0] = {**out[0], "content": fallback_system(out[0]["content"], tools)}
    else:
        out.insert(0, {"role": "system", "content": fallback_system("", tools).lstrip()})
    return out, None


def _as_user(m: dict) -> dict:
    if m.get("role") != "tool":
        return m
    return {"role": "user", "content": f"<tool_response>\n{m['content']}\n</tool_response>"}


def render(tokenizer, messages: list[dict], tools: list[dict] | None, generation_prompt: bool) -> str:
    """The conversation as text under the model's own template (tools natively or by the fallback)."""
    msgs, native_tools = prepare(chat_format(tokenizer), messages, tools)
    return tokenizer.apply_chat_template(msgs, tools=native_tools, tokenize=False, add_generation_prompt=generation_prompt)


def strip_stops(ids: list[int], fmt: ChatFormat) -> list[int]:
    """Generated ids without their trailing stop tokens."""
    end = len(ids)
    while end and ids[end - 1] in fmt.stop_ids:
        end -= 1
    return ids[:end]


class ChatRenderer:
    """Token deltas of a growing conversation under the model's chat template: the prompt, then after
    each assistant turn the ids that close it and carry the environment's reply and the next
    generation prompt. The assistant's own ids are never re-tokenized."""

    def __init__(self, tokenizer, system: str, tools: list[dict] | None) -> None:
        self.tok, self.tools = tokenizer, tools or None
        self.format = chat_format(tokenizer)
        self.messages: list[dict] = [{"role": "system", "content": system}]
        self.eos = self.format.end_of_turn
        self.stop_ids = list(self.format.stop_ids)
        self._end_text = tokenizer.convert_ids_to_tokens(self.eos)
        self.canonical: list[int] = []  # the episode with each generated text as the tokenizer splits it

    def _text(self, messages, gen: bool) -> str:
        return render(self.tok, messages, self.tools, gen)

    def first_prompt(self, user: str) -> list[int]:
        self.messages.append({"role": "user", "content": user})
        ids = self.tok.encode(self._text(self.messages, True), add_special_tokens=False)
        self.canonical = list(ids)
        return ids

    def generated(self, out: list[int], text: str, closed: bool) -> None:
        """Track a generation in `canonical`, the episode as it would be with each generated text
        tokenized by the tokenizer: `text` encoded, then `out`'s trailing stop ids (`closed`: the
        end-of-turn token the caller appended to a generation cut by length)."""
        body = strip_stops(out, self.format)
        self.canonical += self.tok.encode(text, add_special_tokens=False) + out[len(body):] + ([self.eos] if closed else [])

    def reply(self, assistant_text: str, tool_text: str) -> list[int]:
        """Ids that follow the assistant's end-of-turn token: the rest of its turn's closing, the
        environment's message, and the next generation prompt."""
        before = self._text(self.messages + [{"role": "assistant", "content": assistant_text}], False)
        self.messages += [{"role": "assistant", "content": assistant_text}, {"role": "tool", "content": tool_text}]
        after = self._text(self.messages, True)
        if not after.startswith(before):  # a template that rewrites history: the tail (the token-exact check counts it)
            ids = self.tok.encode(after[len(before):], add_special_tokens=False)
        else:
            end = before.rfind(self._end_text)  # the token closing the assistant's turn, already in the episode
            tail = before[end + len(self._end_text):] if end >= 0 else ""
            ids = self.tok.encode(tail + after[len(before):], add_special_tokens=False)
        self.canonical += ids
        return ids

    def tool_calls(self, text: str) -> list[ToolCall]:
        """The tool calls of a generated turn, in the order written (none when the conversation has
        no tools; malformed blocks are left for the harness to answer)."""
        return parse_tool_calls(text)[0] if self.tools else []

    def finish(self, assistant_text: str) -> None:
        """Record the last assistant turn (the one the episode ended on)."""
        self.messages.append({"role": "assistant", "content": assistant_text})

    def fresh_ids(self) -> list[int]:
        """The whole conversation rendered and tokenized afresh (what a re-tokenizing trainer would see)."""
        last = self.messages[-1]["role"]
        return self.tok.encode(self._text(self.messages, last != "assistant"), add_special_tokens=False)


@dataclass(frozen=True)
class TokenExact:
    """The token-exact check of one episode. `mismatches`: tokens that a fresh render of the
    conversation does not reproduce, with each generated text tokenized by the tokenizer (the
    template's doing: it rewrites history, trims text, or renders turns differently from turn to
    turn). `retokenized`: generated tokens the tokenizer would split differently from how the model
    sampled them (a re-tokenizing trainer would score tokens the model never produced; the episode
    keeps the sampled ids, so these are counted, not a fault)."""

    mismatches: int
    retokenized: int
    tokens: int


def check_episode(episode_ids: list[int], chat: ChatRenderer) -> TokenExact:
    """Compare an episode's ids with a fresh render of `chat`'s conversation (see TokenExact)."""
    return TokenExact(mismatches=token_mismatches(chat.canonical, chat.fresh_ids()),
                      retokenized=token_mismatches(episode_ids, chat.canonical), tokens=len(episode_ids))


def token_mismatches(episode_ids: list[int], fresh_ids: list[int]) -> int:
    """Tokens of the episode that a fresh render does not reproduce in place: the episode's length
    minus the tokens in the longest common blocks (in order) of the two sequences, not counting
    what the fresh render adds after the episode's end (the template's trailing newline)."""
    if not episode_ids:
        return 0
    matcher = difflib.SequenceMatcher(None, episode_ids, fresh_ids, autojunk=False)
    return len(episode_ids) - sum(b.size for b in matcher.get_matching_blocks())
