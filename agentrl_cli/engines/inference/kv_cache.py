"""A KV cache that changes in place: Hugging Face's `DynamicLayer` concatenates every layer's keys
and values with the new token at every decode step, and gathers the whole cache whenever a row
leaves or joins, copying all of it each time (measured under the rollout: copies were over half of
the engine's time). `GrowingLayer` keeps keys and values in zeroed buffers with spare rows and
columns; `keys` and `values` are views `buffer[:rows, :, start:end]` of the filled part, so

- a decode step writes one column (`update`);
- a row leaving moves at most one row into its place (`batch_select_indices` with the order
  `swap_remove_order` gives: the batch keeps its rows dense without shifting them all);
- rows joining are written below the others (`append_rows`), aligned at the current column;
- dropping leading padding moves `start` (`trim_front`).

Code that replaces `keys`/`values` itself keeps working: the layer sees they are no longer its views
and adopts them into new buffers at the next change (one copy, as before). Buffers are zeroed, so
masked positions never hold NaN or inf (a masked score is still computed before it is masked).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

MIN_ROOM = 64  # spare columns at least, so a buffer is not regrown every few steps


def swap_remove_order(n: int, keep: list[int]) -> list[int]:
    """An order of the kept rows of an `n`-row batch in which a leaving row's place is taken by a kept
    row from the end: only those rows move (`GrowingLayer.batch_select_indices` moves them in place)."""
    k, alive = len(keep), set(keep)
    order = list(range(k))
    holes = [j for j in range(k) if j not in alive]
    movers = [i for i in range(k, n) if i in alive]
    for hole, mover in zip(holes, movers):
        order[hole] = mover
    return order


class GrowingLayer(DynamicLayer):
    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._kbuf = self._vbuf = self._view = None
        self._rows = self._start = self._end = 0

    # ---- buffers -------------------------------------------------------------------------------

    def _owned(self) -> bool:
        return self._kbuf is not None and self.keys is self._view

    def _set(self, rows: int, start: int, end: int) -> None:
        self._rows, self._start, self._end = rows, start, end
        self.keys, self.values = self._kbuf[:rows, :, start:end], self._vbuf[:rows, :, start:end]
        self._view = self.keys

    def _adopt(self, keys: torch.Tensor, values: torch.Tensor, *, more_cols: int = 0, more_rows: int = 0,
               left: int = 0) -> None:
        """New buffers holding `keys`/`values` from column `left`, with room for `more_cols` columns and
        `more_rows` rows (at least doubling, so regrowing is rare)."""
        rows, heads, n, dim = keys.shape
        cols = left + n + max(more_cols + MIN_ROOM, n)
        self._kbuf = keys.new_zeros((rows + more_rows, heads, cols, dim))
        self._vbuf = values.new_zeros((rows + more_rows, values.shape[1], cols, values.shape[-1]))
        self._kbuf[:rows, :, left:left + n] = keys
        self._vbuf[:rows, :, left:left + n] = values
        self._set(rows, left, left + n)

    # ---- what attention calls ------------------------------------------------------------------

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        add = key_states.shape[-2]
        if self.keys.dim() != 4:  # first update: nothing cached yet
            self.keys, self.values = key_states[:, :, :0], value_states[:, :, :0]
        if (not self._owned() or self._end + add > self._kbuf.shape[2]
                or key_states.shape[0] != self._rows):
            spare = self._kbuf.shape[0] - self._rows if self._owned() else 0
            self._adopt(self.keys, self.values, more_cols=add, more_rows=spare)
        self._kbuf[:self._rows, :, self._end:self._end + add] = key_states
        self._vbuf[:self._rows, :, self._end:self._end + add] = value_states
        self._set(self._rows, self._start, self._end + add)
        return self.keys, self.values

    # ---- what the batch calls when rows leave, join or lose their padding ------------------------

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        order = indices.tolist()
        if not self._owned() or any(i < j for j, i in enumerate(order)) or len(set(order)) != len(order):
            super().batch_select_indices(indices)  # a general gather: new tensors, adopted on the next update
            return
        s, e = self._start, self._end
        for j, i in enumerate(order):  # every source is at or after its destination: safe in place
            if i != j:
                self._kbuf[j, :, s:e] = self._kbuf[i, :, s:e]
                self._vbuf[j, :, s:e] = self._vbuf[i, :, s:e]
        self._set(len(order), s, e)

    def append_rows(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Add rows (`keys`/`values` [rows, heads, width, dim], left-padded) below the others, their last
        column at the current one; the view widens to the left if they are wider."""
        if self.keys.dim() != 4 or self.keys.shape[0] == 0:
            self.keys, self.values = keys, values  # nothing here yet: adopted on the next update
            return
        k, width = keys.shape[0], keys.shape[2]
        if not self._owned() or self._rows + k > self._kbuf.shape[0] or self._end - width < 0:
            n = self._end - self._start  # room on the left too, for the next wider rows
            self._adopt(self.keys, self.values, more_cols=0, more_rows=max(k, self._rows),
                        left=max(0, width - n) + max(MIN_ROOM, n // 4))
        start = min(self._start, self._end - width)
        self._kbuf[:self._rows, :, start:self._start] = 0  # columns the view widens over (trimmed earlier)
        self._vbuf[:self._rows, :, start:self._start] = 0
        self._kbuf[self._rows:self._rows + k, :, start:self._end] = 0  # rows reused after a row left
        self._vbuf[self._rows:self._rows + k, :, start:self._end] = 0
        self._kbuf[self._rows:self._rows + k, :, self._end - width:self._end] = keys
        self._vbuf[self._rows:self._rows + k, :, self._end - width:self._end] = values
        self._set(self._rows + k, start, self._end)

    def reserve(self, add: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """`update` without the copy: room for `add` new columns after the filled ones, which the caller
        writes (the native step writes its keys and values there itself); returns the widened views.
        The layer must hold keys already (`update` has run once)."""
        if not self._owned() or self._end + add > self._kbuf.shape[2]:
            spare = self._kbuf.shape[0] - self._rows if self._owned() else 0
            self._adopt(self.keys, self.values, more_cols=add, more_rows=spare)
        self._set(self._rows, self._start, self._end + add)
        return self.keys, self.values

    def trim_front(self, lead: int) -> None:
        """Drop the first `lead` columns (padding in every row)."""
        if self._owned():
            self._set(self._rows, self._start + lead, self._end)
        else:
            self.keys, self.values = self.keys[:, :, lead:], self.values[:, :, lead:]


def new_cache(config) -> DynamicCache:
    """A DynamicCache for `config` whose full-attention layers change in place (sliding-window layers,
    if the model has any, stay as transformers makes them)."""
    try:
        cache = DynamicCache(config=config)
    except TypeError:  # transformers 4.x: layers are not objects; keep its cache as it is
        return DynamicCache()
    layers = getattr(cache, "layers", None)
    if layers:
        cache.layers = [GrowingLayer() if type(layer) is DynamicLayer else layer for layer in layers]
    return cache


def append_rows(cache, keys_values: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Rows joining `cache`, per layer (K, V) [rows, heads, width, dim], left-padded."""
    for layer, (k, v) in zip(cache.layers, keys_values):
        if isinstance(layer, GrowingLayer):
            layer.append_rows(k, v)
        else:
            width = max(layer.keys.shape[2], k.shape[2])
            pad = lambda t: torch.nn.functional.pad(t, (0, 0, width - t.shape[2], 0))  # noqa: E731
            layer.keys = torch.cat([pad(layer.keys), pad(k)])
            layer.values = torch.cat([pad(layer.values), pad(v)])


def trim_front(cache, lead: int) -> None:
    for layer in cache.layers:
        if isinstance(layer, GrowingLayer):
            layer.trim_front(lead)
        else:
            layer.keys, layer.values = layer.keys[:, :, lead:], layer.values[:, :, lead:]
