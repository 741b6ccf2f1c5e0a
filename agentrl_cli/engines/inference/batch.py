"""Decoding one batch: left-padded prefill in one forward pass, then one forward pass per step over
the KV cache for the rows still running. Finished rows leave the batch (their cache rows are
dropped), so they neither cost compute nor change; requests that arrive while it runs join it
between steps (prefilled on their own, caches merged with masked left padding). With a
`PrefixCache`, a request that starts with tokens an earlier row was fed prefills only the rest, on
top of the cached keys and values; rows leaving the batch leave their KV in the cache.

A streamed request's `on_token` is called (in the scheduler thread, so it must only hand the token
on) with each token as it is sampled, before the step's next forward pass.

`Request` is the engine's record of one generation request; `BatchRun` mutates it and reports
back through the `BatchHooks` the engine implements (pause/abort checkpoints, completion,
retraction). Queueing, locks and weight swaps belong in `engine.py`. The run's prefill and decode
steps are timed into the engine's `EngineStats` phase counters (`stats.py`).
"""

from __future__ import annotations

import inspect
import itertools
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable, Protocol

import torch

from agentrl_cli.engines.inference.decode_step import decode_for
from agentrl_cli.engines.inference.kv_cache import append_rows, new_cache, swap_remove_order, trim_front
from agentrl_cli.engines.inference.prefix_cache import MIN_MATCH, Prefix, PrefixCache
from agentrl_cli.engines.inference.sampling import BatchSampler, GenParams, check_finished, prompt_logprobs
from agentrl_cli.engines.inference.stats import EngineStats

_PASSES = itertools.count()  # numbers the prefill passes (`BatchRun._forward`)
ABORTED = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}


def _whole_prompt(r: "Request") -> bool:
    """Whether `r` asks for every prompt token's log-prob (its whole prompt's logits are computed)."""
    return r.return_logprob and r.logprob_start_len == 0


def _device_of(model) -> torch.device:
    """The device of the model's weights (cpu for a model without any)."""
    first = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
    return first.device if first is not None else torch.device("cpu")


@dataclass(eq=False)
class Request:
    rid: str
    input_ids: list[int]
    params: GenParams
    return_logprob: bool
    logprob_start_len: int
    future: Future
    seq: int
    admitted: bool  # False while it waits on a pause (SGLang: not yet inside the scheduler)
    internal: bool = False  # health checks: not counted in metrics
    adapter: object = None  # the LoRA adapter serving it (lora.Adapter); None: the base weights
    started: float = field(default_factory=time.perf_counter)
    arrival: float = field(default_factory=time.monotonic)
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    input_logprobs: list | None = None
    weight_version: str = ""
    retractions: int = 0
    abort_message: str | None = None  # set by abort(); the batch finishes the row at its next step
    finished: bool = False
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache
    on_token: Callable[[int, float, str], None] | None = None  # a streamed request's listener: (id, log-prob, weight version)

    def reset_for_retry(self) -> None:
        self.output_ids, self.output_logprobs, self.input_logprobs = [], [], None
        self.cached_tokens = 0
        self.finished = False
        self.retractions += 1

    def result(self, finish_reason: dict) -> dict:
        return {"rid": self.rid, "output_ids": list(self.output_ids), "output_logprobs": list(self.output_logprobs),
                "input_logprobs": self.input_logprobs, "finish_reason": finish_reason,
                "prompt_tokens": len(self.input_ids), "completion_tokens": len(self.output_ids),
                "cached_tokens": self.cached_tokens,
                "weight_version": self.weight_version, "retractions": self.retractions,
                "e2e_latency": time.perf_counter() - self.started}


class BatchHooks(Protocol):
    def checkpoint(self, active: list[Request]) -> str:
        """Called between steps: "run", "hold" (finish aborted rows, then ask again) or "retract"."""

    def finish(self, req: Request, finish_reason: dict) -> None: ...

    def retract(self, reqs: list[Request]) -> None: ...

    def admit(self, room: int) -> list[Request]:
        """Requests that may join the running batch now (same weights), at most `room`."""


class BatchRun:
    """Runs `reqs` to completion on `model`; every request ends through `hooks.finish` or `hooks.retract`."""

    def __init__(self, model, tokenizer, reqs: list[Request], hooks: BatchHooks, *, pad_id: int, max_rows: int = 64,
                 prefix_cache: PrefixCache | None = None, stats: EngineStats | None = None, lean: bool = True) -> None:
        """`stats`: where the prefill and decode steps are timed (the engine's; None: nowhere kept);
        `lean`: decode with `decode_step` when it knows the model (else the model's forward)."""
        self.model, self.tokenizer, self.hooks, self.pad_id, self.max_rows = model, tokenizer, hooks, pad_id, max_rows
        self.stats = stats if stats is not None else EngineStats()
        self.prefix_cache = prefix_cache if prefix_cache is not None and prefix_cache.enabled else None
        self.active = list(reqs)
        self.device = _device_of(model)  # where the batch's tensors are made: the model's
        self.sampler = BatchSampler([r.params for r in reqs], model.config.vocab_size, self.device)
        self.generated = 0
        self._prefilled = 0  # prompt tokens computed by the prefill being timed
        self.leaving: list[tuple[Request, dict]] = []  # finished rows, reported once `_select` drops them
        # transformers 5 calls the KV cache argument `cache`; 4.x called it `past_key_values`
        self.cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        self.lean = decode_for(model) if lean else None  # Llama-shaped models decode without the module walk (decode_step.py)
        # per row: None, or (source, lo, hi) where its cache columns [lo, hi) are copies of one prefix's
        # keys and values (`source` names that copy); rows alike read one row's copy (`_shared_rows`)
        self.shared: list[tuple | None] = []

    def run(self) -> int:
        """Decode until every row has finished; returns the number of tokens generated."""
        logits, cache, mask, pos, self.shared = self._timed_prefill()
        while self.active:
            action = self.hooks.checkpoint(self.active)
            if action == "retract":
                self.hooks.retract(self.active)
                self.active = []
                break
            keep = self._finish_aborted()
            if keep is not None:
                keep = swap_remove_order(len(self.active), keep)
                logits, cache, mask, pos = self._select(keep, logits, cache, mask, pos)
            if not self.active or action == "hold":
                continue
            t = time.perf_counter()
            tokens = self._sample_and_check(logits)
            sampled = len(tokens)
            keep = [i for i, r in enumerate(self.active) if not r.finished]
            if len(keep) < len(self.active):
                keep = swap_remove_order(len(self.active), keep)  # a leaving row's place goes to the last row
                tokens = [tokens[i] for i in keep]
                logits, cache, mask, pos = self._select(keep, logits, cache, mask, pos)
            if not self.active:
                self.stats.decode(time.perf_counter() - t, sampled, 0)
                break
            mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
            pos = pos + 1
            logits = self._decode(torch.tensor(tokens, dtype=torch.long, device=self.device), mask, pos, cache,
                                  self._shared_rows())
            self.stats.decode(time.perf_counter() - t, sampled, len(self.active))
            joining = self.hooks.admit(self.max_rows - len(self.active))
            if joining:
                logits, cache, mask, pos = self._join(joining, logits, cache, mask, pos)
        return self.generated

    def _decode(self, tokens: torch.Tensor, mask, pos, cache, shared: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [rows, vocab] of one new token per row, its key and value added to `cache`."""
        if self.lean is not None and hasattr(cache, "layers"):
            if shared is None:
                return self.lean.step(tokens, mask, pos, cache)
            return self.lean.step(tokens, mask, pos, cache, shared=shared)
        out = self.model(input_ids=tokens[:, None], attention_mask=mask, position_ids=pos[:, None], use_cache=True,
                         **{self.cache_kw: cache})
        return out.logits[:, -1, :]

    def _join(self, joining: list[Request], logits, cache, mask, pos):
        """Prefill late arrivals on their own and merge them into the running batch."""
        sub = BatchRun(self.model, self.tokenizer, joining, self.hooks, pad_id=self.pad_id, max_rows=self.max_rows,
                       prefix_cache=self.prefix_cache, stats=self.stats)
        logits2, cache2, mask2, pos2, shared2 = sub._timed_prefill()
        append_rows(cache, [(layer.keys, layer.values) for layer in cache2.layers])  # in place: no copy of the batch
        width = max(mask.shape[1], mask2.shape[1])
        self.shared = _shifted(self.shared, width - mask.shape[1]) + _shifted(shared2, width - mask2.shape[1])
        mask = torch.cat([torch.nn.functional.pad(mask, (width - mask.shape[1], 0)),
                          torch.nn.functional.pad(mask2, (width - mask2.shape[1], 0))])
        self.active += sub.active
        self.sampler.extend(sub.sampler)
        return torch.cat([logits, logits2]), cache, mask, torch.cat([pos, pos2])

    @staticmethod
    def _merge(a: tuple, b: tuple) -> tuple:
        """Two prefilled (logits, cache, mask, pos, shared) as one batch, rows of `a` first: both KV caches
        are left-padded to one length (padding masked out), so every row still sees only its tokens."""
        logits, cache, mask, pos, shared = a
        logits2, cache2, mask2, pos2, shared2 = b
        width = max(mask.shape[1], mask2.shape[1])

        def left(t: torch.Tensor, dim_len: int) -> torch.Tensor:
            return torch.nn.functional.pad(t, (0, 0, width - dim_len, 0))

        for x, y in zip(cache.layers, cache2.layers):
            x.keys = torch.cat([left(x.keys, mask.shape[1]), left(y.keys, mask2.shape[1])])
            x.values = torch.cat([left(x.values, mask.shape[1]), left(y.values, mask2.shape[1])])
        shared = _shifted(shared, width - mask.shape[1]) + _shifted(shared2, width - mask2.shape[1])
        mask = torch.cat([torch.nn.functional.pad(mask, (width - mask.shape[1], 0)),
                          torch.nn.functional.pad(mask2, (width - mask2.shape[1], 0))])
        return torch.cat([logits, logits2]), cache, mask, torch.cat([pos, pos2]), shared

    def _shared_rows(self) -> torch.Tensor | None:
        """[rows, 3] int32 (source row, lo, hi) for the decode step: each row's columns [lo, hi) are
        read from the first row holding a copy of the same prefix at the same columns (the values
        are the same: copies of one prefix's keys and values), so a prefix that many rows share is
        read from memory once a step instead of once a row; None when no two rows share one."""
        first: dict[tuple, int] = {}
        rows, any_shared = [], False
        for i, s in enumerate(self.shared):
            if s is None:
                rows.append((i, 0, 0))
                continue
            src = first.setdefault(s, i)
            any_shared |= src != i
            rows.append((src, s[1], s[2]))
        return torch.tensor(rows, dtype=torch.int32) if any_shared else None

    def _lookup(self, r: Request) -> Prefix | None:
        if self.prefix_cache is None or _whole_prompt(r):
            return None  # whole-prompt log-probs need the prompt's logits
        hit = self.prefix_cache.lookup(r.input_ids)
        r.cached_tokens = hit.length if hit is not None else 0
        return hit

    def _timed_prefill(self):
        t, self._prefilled = time.perf_counter(), 0
        out = self._prefill()
        self.stats.prefill(time.perf_counter() - t, self._prefilled)
        return out

    def _prefill(self):
        """Prefill the rows: those with a cached prefix on top of it, the others whole, as two
        forward passes merged (one padded pass would pay every row the longest uncached prompt).
        Rows the cache missed that start alike (a harness's system prompt, a group's samples of one
        prompt) are prefilled on top of their shared prefixes, each computed once (`_shared_prefixes`)."""
        hits = [self._lookup(r) for r in self.active]
        fresh = [i for i, (r, h) in enumerate(zip(self.active, hits)) if h is None and not _whole_prompt(r)]
        for i, prefix in self._shared_prefixes([self.active[i].input_ids for i in fresh]).items():
            hits[fresh[i]] = prefix
        if not any(hits):
            return self._forward(self.active)
        missed = [r for r, h in zip(self.active, hits) if h is None]
        cached = [(r, h) for r, h in zip(self.active, hits) if h is not None]
        if missed:  # rows in the order of the merged batch; the sampler follows them
            self.active = missed + [r for r, _ in cached]
            self.sampler = BatchSampler([r.params for r in self.active], self.model.config.vocab_size, self.device)
        on_top = self._forward([r for r, _ in cached], [h for _, h in cached])
        return self._merge(self._forward(missed), on_top) if missed else on_top

    def _shared_prefixes(self, prompts: list[list[int]]) -> dict[int, Prefix]:
        """Prompt index -> the longest prefix it shares with at least one other prompt (at least
        `MIN_MATCH` tokens more than the prefix it is computed on top of, never a prompt's last
        token), its keys and values computed once per shared prefix: a radix tree over the prompts,
        walked from the root, each inner node's tokens prefilled as one row on top of its parent's.
        SGLang's radix cache does this across requests; here it is within one batch."""
        out: dict[int, Prefix] = {}

        def walk(rows: list[int], base: Prefix | None) -> None:
            done = base.length if base is not None else 0
            while len(rows) >= 2:
                seqs = [prompts[i] for i in rows]
                limit = min(map(len, seqs)) - 1
                common = done
                while common < limit and all(s[common] == seqs[0][common] for s in seqs):
                    common += 1
                if common - done >= MIN_MATCH:
                    base, done = self._extend(base, seqs[0][:common]), common
                groups: dict[int, list[int]] = {}
                for i in rows:
                    groups.setdefault(prompts[i][common], []).append(i)
                if len(groups) > 1:
                    for group in groups.values():
                        walk(group, base)
                    return
                # all alike up to the shortest prompt's last token: those prompts stop here, the rest go on
                take([i for i in rows if len(prompts[i]) - 1 == common], base)
                rows = [i for i in rows if len(prompts[i]) - 1 > common]
            take(rows, base)

        def take(rows: list[int], base: Prefix | None) -> None:
            if base is not None:
                out.update(dict.fromkeys(rows, base))

        walk(list(range(len(prompts))), None)
        return out

    def _extend(self, base: Prefix | None, ids: list[int]) -> Prefix:
        """The keys and values of `ids` (one row), computed on top of `base`'s (its first tokens)."""
        done = base.length if base is not None else 0
        cache = new_cache(self.model.config)
        if base is not None:
            for layer, (k, v) in enumerate(base.layers):
                cache.update(k[None], v[None], layer)
        self._prefilled += len(ids) - done
        self.model(input_ids=torch.tensor([ids[done:]], dtype=torch.long, device=self.device),
                   attention_mask=torch.ones((1, len(ids)), dtype=torch.long, device=self.device),
                   position_ids=torch.arange(done, len(ids), device=self.device)[None], use_cache=True, logits_to_keep=1,
                   **{self.cache_kw: cache})
        return Prefix(len(ids), [(layer.keys[0], layer.values[0]) for layer in cache.layers])

    def _forward(self, reqs: list[Request], prefixes: list[Prefix] | None = None):
        """One left-padded forward pass over `reqs`' prompts; with `prefixes`, over what follows each
        cached prefix, the prefixes' KV left-padded in front (padding masked out)."""
        done = [p.length for p in prefixes] if prefixes else [0] * len(reqs)
        past = max(done)
        width = max(len(r.input_ids) - c for r, c in zip(reqs, done))
        self._prefilled += sum(len(r.input_ids) - c for r, c in zip(reqs, done))
        ids = torch.full((len(reqs), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(reqs), past + width), dtype=torch.long)
        for i, (r, c) in enumerate(zip(reqs, done)):
            rest = r.input_ids[c:]
            ids[i, width - len(rest):] = torch.tensor(rest, dtype=torch.long)
            mask[i, past + width - len(rest):] = 1
            mask[i, past - c:past] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)  # filled here, moved once
        new = mask[:, past:]
        positions = (new.cumsum(-1) - 1).clamp(min=0) + torch.tensor(done, dtype=torch.long, device=self.device)[:, None]
        whole_prompt = any(map(_whole_prompt, reqs))
        cache = new_cache(self.model.config)
        if past:
            for layer in range(len(prefixes[0].layers)):
                k0, v0 = prefixes[0].layers[layer]
                keys = k0.new_zeros((len(reqs), k0.shape[0], past, k0.shape[2]))
                values = v0.new_zeros((len(reqs), v0.shape[0], past, v0.shape[2]))
                for i, p in enumerate(prefixes):
                    k, v = p.layers[layer]
                    keys[i, :, past - p.length:] = k
                    values[i, :, past - p.length:] = v
                cache.update(keys, values, layer)
        last = None
        if self.lean is not None and not whole_prompt and hasattr(cache, "layers"):
            last = self.lean.prefill(ids, mask, positions, cache)  # one native call, where it takes them
        if last is None:
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                             logits_to_keep=0 if whole_prompt else 1, **{self.cache_kw: cache})
            last = out.logits[:, -1, :]
        # rows on top of one prefix hold copies of its keys and values at the same columns (the pass's
        # number in the key: a prefix freed since may have left its address to another)
        run = next(_PASSES)
        shared = [((run, p.layers[0][0].data_ptr(), p.length), past - p.length, past) if p is not None and p.length else None
                  for p in (prefixes or [None] * len(reqs))]
        for i, r in enumerate(reqs):
            if _whole_prompt(r):
                own = out.logits[i, width - len(r.input_ids):]
                r.input_logprobs = prompt_logprobs(own, r.input_ids, r.params.temperature)
        return last, cache, mask, positions[:, -1], shared

    def _keep_prefixes(self, leaving: list[int], cache, mask) -> None:
        """Leave the KV of rows that leave the batch in the prefix cache: the tokens they were fed
        (prompt and output, the last sampled token not yet fed) at their unmasked positions."""
        for i in leaving:
            r = self.active[i]
            where = mask[i].nonzero().squeeze(1)
            fed = r.input_ids + r.output_ids
            if len(where) > len(fed):
                continue
            self.prefix_cache.insert(fed[:len(where)], [(layer.keys[i][:, where], layer.values[i][:, where])
                                                        for layer in cache.layers])

    def _finish_aborted(self) -> list[int] | None:
        aborted = [r for r in self.active if r.abort_message is not None]
        for r in aborted:
            r.finished = True
            self.leaving.append((r, {**ABORTED, "message": r.abort_message}))
        if not aborted:
            return None
        return [i for i, r in enumerate(self.active) if not r.finished]

    def _sample_and_check(self, logits: torch.Tensor) -> list[int]:
        tokens, logprobs = self.sampler.sample(logits, [len(r.output_ids) for r in self.active])
        for r, tok, lp in zip(self.active, tokens, logprobs):
            r.output_ids.append(tok)
            r.output_logprobs.append(lp)
            self.generated += 1
            if r.on_token is not None:
                r.on_token(tok, lp, r.weight_version)
            reason = check_finished(r.params, r.output_ids, self.tokenizer)
            if reason is not None:
                r.finished = True
                self.leaving.append((r, reason))
        return tokens

    def _select(self, keep: list[int], logits, cache, mask, pos):
        """Keep the rows `keep`, in that order (`swap_remove_order`: only rows taking a leaver's place move)."""
        if self.prefix_cache is not None:  # before the requests complete: a flush after that must find it
            kept = set(keep)
            self._keep_prefixes([i for i in range(len(self.active)) if i not in kept], cache, mask)
        self.active = [self.active[i] for i in keep]
        self.shared = [self.shared[i] for i in keep]
        leaving, self.leaving = self.leaving, []
        for r, reason in leaving:
            self.hooks.finish(r, reason)
        if not keep:
            return logits, cache, mask, pos
        self.sampler.select(keep)
        idx = torch.tensor(keep, dtype=torch.long, device=self.device)
        cache.batch_select_indices(idx)
        return logits[idx], cache, self._trim(cache, mask[idx]), pos[idx]

    def _trim(self, cache, mask: torch.Tensor) -> torch.Tensor:
        """Drop the leading columns that are padding in every remaining row. Without this a batch kept
        alive by joins only ever widens (one column per step, padded to its longest row ever), and
        every step attends over, and every join copies, the padding of rows long gone."""
        used = mask.any(dim=0)
        lead = int(used.int().argmax()) if bool(used.any()) else 0
        if lead == 0:
            return mask
        trim_front(cache, lead)
        self.shared = _shifted(self.shared, -lead)
        return mask[:, lead:]


def _shifted(shared: list[tuple | None], by: int) -> list[tuple | None]:
    """`BatchRun.shared` with every row's columns moved `by` (padding added or trimmed on the left)."""
    return [None if s is None else (s[0], s[1] + by, s[2] + by) for s in shared]
