"""The embedded engine's prefix cache: the KV of finished generations, kept for the next request
that starts with the same tokens (SGLang's radix cache in the small).

An agent's next turn is its previous prompt, the completion, then the environment's reply: with
this cache the server prefills only the reply instead of the whole conversation every turn, and
episodes of one harness share the KV of their system prompt and tool schemas. An entry is the
token ids a finished (or aborted) row had been fed and their keys and values per layer. A lookup
returns the entry with the longest common prefix with the request (at least `min_match` tokens,
never the request's last token, which is always computed for its logits). Entries are evicted least
recently used beyond `max_tokens`; every weight change clears the cache (the KV came from other
weights), as does `/flush_cache`. Thread-safe: the scheduler inserts and looks up, HTTP threads clear.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

MIN_MATCH = 16  # a shorter shared prefix saves less than splitting the prefill costs


@dataclass
class Prefix:
    """A hit: the first `length` tokens' keys and values, one (K, V) per layer, each [heads, length, dim]."""

    length: int
    layers: list[tuple[torch.Tensor, torch.Tensor]]


@dataclass
class _Entry:
    ids: np.ndarray
    layers: list[tuple[torch.Tensor, torch.Tensor]]


class PrefixCache:
    def __init__(self, max_tokens: int, min_match: int = MIN_MATCH) -> None:
        self.max_tokens, self.min_match = max_tokens, max(1, min_match)
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._next = 0
        self.tokens = 0
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.max_tokens > 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, ids: list[int]) -> Prefix | None:
        """The longest cached prefix of `ids` (at most len(ids) - 1 tokens), or None. An entry matched
        whole is removed: the request extends it and stores the longer sequence when it finishes."""
        if not self.enabled or len(ids) <= self.min_match:
            return None
        req = np.asarray(ids, dtype=np.int64)
        with self._lock:
            best, best_len = None, 0
            for key, entry in self._entries.items():
                n = min(len(entry.ids), len(req) - 1)
                if n <= best_len or entry.ids[0] != req[0]:
                    continue
                diff = np.flatnonzero(entry.ids[:n] != req[:n])
                common = int(diff[0]) if len(diff) else n
                if common > best_len:
                    best, best_len = key, common
            if best is None or best_len < self.min_match:
                return None
            entry = self._entries[best]
            if best_len == len(entry.ids):
                del self._entries[best]
                self.tokens -= len(entry.ids)
            else:
                self._entries.move_to_end(best)
        return Prefix(best_len, [(k[:, :best_len], v[:, :best_len]) for k, v in entry.layers])

    def insert(self, ids: list[int], layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Keep `layers` (per layer K and V, [heads, len(ids), dim], owned by the cache from now on)."""
        if not self.enabled or len(ids) < self.min_match or len(ids) > self.max_tokens:
            return
        with self._lock:
            self._entries[self._next] = _Entry(np.asarray(ids, dtype=np.int64), layers)
            self._next += 1
            self.tokens += len(ids)
            while self.tokens > self.max_tokens:
                _, old = self._entries.popitem(last=False)
                self.tokens -= len(old.ids)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.tokens = 0
