"""The text of a growing list of token ids, for streams: decoded over a window of the last tokens
(vLLM's prefix and read offsets), so a token that ends inside a multi-byte character adds nothing
until the character is complete, and a long generation is not decoded again at every token."""

from __future__ import annotations


class Detokenizer:
    """`add(ids)` then read `text`, the text of every id added so far (the last few may still be
    pending, when they end inside a character)."""

    def __init__(self, tokenizer, skip_special_tokens: bool = True) -> None:
        self.tokenizer, self.skip = tokenizer, skip_special_tokens
        self.ids: list[int] = []
        self.text = ""
        self._prefix = self._read = 0

    def add(self, ids: list[int]) -> str:
        """Add ids; returns the text they completed."""
        self.ids += ids
        decode = self.tokenizer.decode
        before = decode(self.ids[self._prefix:self._read], skip_special_tokens=self.skip)
        after = decode(self.ids[self._prefix:], skip_special_tokens=self.skip)
        if len(after) > len(before) and after.startswith(before) and not after.endswith("\ufffd"):
            new = after[len(before):]
            self.text += new
            self._prefix, self._read = self._read, len(self.ids)
            return new
        return ""
