"""OpenAI response objects as SGLang writes them: `chat.completion` (ids "chatcmpl-…", a message
with `content`, `reasoning_content` and `tool_calls`, finish_reason "tool_calls" when calls were
parsed, `matched_stop`, `usage`, `metadata.weight_version`), `chat.completion.chunk` server-sent
events, `text_completion`, and log-probs (`{"content": [{token, bytes, logprob, top_logprobs}]}`
for chat, `{text_offset, token_logprobs, tokens, top_logprobs}` for completions).

Log-probs cover every generated token, the stop token that ended the turn included, exactly as
`/generate` returns them (`output_token_logprobs`), so a client can compare the two one to one.
Pure functions of what was generated; nothing here generates or validates.
"""

from __future__ import annotations

import time
import uuid

from agentrl_cli.engines.inference.protocol import dumps
from agentrl_cli.engines.openai_api.base import Completion
from agentrl_cli.engines.openai_api.parse import ParsedTurn


def token_text(tokenizer, token_id: int) -> str:
    return tokenizer.decode([token_id], skip_special_tokens=False)


def _entry(tokenizer, token_id: int, logprob: float) -> dict:
    text = token_text(tokenizer, token_id)
    return {"token": text, "bytes": list(text.encode("utf-8")), "logprob": logprob}


def chat_logprobs(tokenizer, completion: Completion) -> list[dict]:
    """`logprobs.content` of one choice: one entry per generated token."""
    tops = completion.top_logprobs or [[] for _ in completion.output_ids]
    return [{**_entry(tokenizer, t, lp), "top_logprobs": [_entry(tokenizer, i, v) for i, v in top]}
            for t, lp, top in zip(completion.output_ids, completion.output_logprobs, tops)]


def finish(turn_has_calls: bool, completion: Completion) -> tuple[str, int | str | None]:
    """(finish_reason, matched_stop): "tool_calls" (and no matched stop) when a turn that stopped made calls."""
    if turn_has_calls and completion.finish_reason == "stop":
        return "tool_calls", None
    return completion.finish_reason, completion.matched_stop


def chat_choice(index: int, turn: ParsedTurn, completion: Completion, logprobs: list[dict] | None) -> dict:
    reason, matched = finish(bool(turn.tool_calls), completion)
    return {"index": index,
            "message": {"role": "assistant", "content": turn.content, "reasoning_content": None,
                        "tool_calls": turn.tool_calls or None},
            "logprobs": None if logprobs is None else {"content": logprobs},
            "finish_reason": reason, "matched_stop": matched}


def usage(prompt_tokens: int, completions: list[Completion]) -> dict:
    """SGLang's usage: prompt tokens counted once per prompt, completion tokens summed over choices."""
    generated = sum(len(c.output_ids) for c in completions)
    return {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + generated, "completion_tokens": generated,
            "prompt_tokens_details": None, "reasoning_tokens": 0}


def weight_version(completions: list[Completion]) -> str:
    return completions[0].weight_version if completions else ""


def chat_response(model: str, choices: list[dict], prompt_tokens: int, completions: list[Completion]) -> dict:
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": choices, "usage": usage(prompt_tokens, completions),
            "metadata": {"weight_version": weight_version(completions)}}


def completion_logprobs(tokenizer, completion: Completion, top: int) -> dict:
    """Legacy completions log-probs: text offsets, tokens, their log-probs, top-k dicts when asked."""
    tokens = [token_text(tokenizer, t) for t in completion.output_ids]
    offsets, at = [], 0
    for text in tokens:
        offsets.append(at)
        at += len(text)
    tops = None
    if top:
        tops = [{token_text(tokenizer, i): v for i, v in row} for row in completion.top_logprobs]
    return {"text_offset": offsets, "token_logprobs": list(completion.output_logprobs), "tokens": tokens,
            "top_logprobs": tops}


def text_response(model: str, choices: list[dict], prompt_tokens: int, completions: list[Completion]) -> dict:
    return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": model, "choices": choices, "usage": usage(prompt_tokens, completions),
            "metadata": {"weight_version": weight_version(completions)}}


def sse(obj) -> str:
    """One server-sent event, compact JSON as SGLang writes it."""
    return f"data: {dumps(obj).decode('utf-8')}\n\n"


DONE = "data: [DONE]\n\n"


def token_pieces(tokenizer, ids: list[int], skip_special_tokens: bool = True) -> list[str]:
    """The text each token adds, decoded incrementally over a short window (a token that ends inside
    a multi-byte character adds nothing until the character is complete)."""
    pieces, start, read = [], 0, 0
    for i in range(len(ids)):
        before = tokenizer.decode(ids[start:read], skip_special_tokens=skip_special_tokens)
        after = tokenizer.decode(ids[start:i + 1], skip_special_tokens=skip_special_tokens)
        if len(after) > len(before) and after.startswith(before) and not after.endswith("\ufffd"):
            pieces.append(after[len(before):])
            start, read = read, i + 1
        else:
            pieces.append("")
    return pieces
