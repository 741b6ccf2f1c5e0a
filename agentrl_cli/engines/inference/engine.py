"""The embedded inference engine: a Hugging Face causal LM behind a scheduler thread that batches
requests arriving within a short window, plus SGLang's control semantics (pause/continue, abort by
rid prefix, weight updates from disk or from received tensors under a writer lock, weight
versions, counters), and a prefix cache (`prefix_cache.py`) so an agent's next turn prefills only
what it adds to the conversation.

Concurrency model: one scheduler thread owns the model and runs one static batch at a time
(`batch.py`). Everything else talks to it through a queue guarded by one condition variable.
A weight update loads the new model in the caller's thread, then the scheduler swaps it in
between batches: requests submitted before the update finish on the old weights (or are
aborted when asked), requests submitted after it wait for the new ones, so no request ever mixes
two weight versions. Loading a directory (in full, or into a copy of the serving model) is
`loading.py`'s; HTTP shapes belong in `protocol.py` / `hf_server.py`.

LoRA adapters (SGLang's `load_lora_adapter` / `unload_lora_adapter`): each loaded adapter is a copy
of the serving model with the adapter merged in (`lora.py`), under its name, with its own prefix
cache (keys and values of other weights are never reused). A request naming an adapter
(`lora_path`) is decoded by that copy, one without by the base; a batch holds the requests of one
adapter only (the oldest eligible request's), and while requests of another adapter wait, no more
join it. Loading a name already loaded is refused, as SGLang does; an adapter that does not fit
leaves the engine as it was. Unloading refuses new requests for the name at once; requests already
queued or running on it finish on it. A full weight update keeps the loaded adapters, as SGLang
does: each is merged again onto the new base and swapped in with it (one that no longer fits the
new base is unloaded, its waiting requests aborted, and the update's message names it).
A request served by an adapter reports the weight version the engine had when that adapter was
loaded (or merged again by a weight update); one served by the base, the engine's current version.
"""

from __future__ import annotations

import copy
import itertools
import logging
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from agentrl_cli.engines.inference import loading
from agentrl_cli.engines.inference.batch import ABORTED, BatchRun, Request
from agentrl_cli.engines.inference.lora import Adapter, merged_model, read_adapter
from agentrl_cli.engines.inference.prefix_cache import PrefixCache
from agentrl_cli.engines.inference.sampling import GenParams, context_error
from agentrl_cli.engines.inference.stats import EngineStats

log = logging.getLogger(__name__)

PAUSE_MODES = ("abort", "retract", "in_place")
WAITING_ABORT = {"type": "abort", "message": "Abort in waiting queue"}
STREAMED_RETRACT = "Aborted: a streamed request cannot restart after a retraction (its tokens were sent)"
MAX_WINDOW_FACTOR = 8  # a batch forms at most this many windows after its first request


@dataclass(eq=False)
class _Swap:
    model: object
    model_path: str
    weight_version: str | None
    adapters: list = field(default_factory=list)  # (Adapter, its files merged onto `model`)
    dropped: list = field(default_factory=list)  # adapters that do not fit `model`
    barrier: int = 0
    done: threading.Event = field(default_factory=threading.Event)
    ok: bool = False


class HFEngine:
    """Batching generation over one model directory; thread-safe; `close()` when done. `device`
    ("cpu", "cuda", "cuda:1") holds the model, its KV cache and the batch's tensors; weights that
    arrive (from disk, from tensors, LoRA adapters) are copied onto it. `lean_decode`: decode steps
    of Llama-shaped models run `decode_step.LlamaDecode` (same computation, without the module walk);
    False: always the model's own forward."""

    def __init__(self, model_path, dtype: str = "float32", max_batch_size: int = 64, batch_window_ms: float = 10.0,
                 context_length: int | None = None, weight_version: str = "default", prefix_cache_tokens: int = 0,
                 device: str = "cpu", lean_decode: bool = True) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {device!r} needs CUDA, which this process does not have; use device='cpu'")
        self.model_path = self.tokenizer_path = str(model_path)
        self.dtype, self.max_batch_size, self.batch_window_s = dtype, max_batch_size, batch_window_ms / 1000.0
        self.lean_decode = lean_decode
        self.tokenizer = loading.load_tokenizer(self.model_path)
        self._model = self._load(self.model_path)
        self.context_length = int(context_length or self._model.config.max_position_embeddings)
        self.weight_version = weight_version
        self.eos_ids = loading.eos_ids(self._model, self.tokenizer)
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else min(self.eos_ids, default=0)
        self._cv = threading.Condition()
        self._update_lock = threading.Lock()  # one weight update at a time
        self._queue: list[Request] = []
        self._running: list[Request] = []
        self._paused: str | None = None
        self._swap: _Swap | None = None
        self._spare = None  # the model the last weight update retired, reused by the next (`_copy_of_serving`)
        self._seq = itertools.count()
        self._closed = False
        self.stats = EngineStats()
        self.prefix_cache_tokens = prefix_cache_tokens
        self.prefix_cache = PrefixCache(prefix_cache_tokens)  # the base weights'
        self._adapters: dict[str, Adapter] = {}
        self._running_adapter: Adapter | None = None
        self._thread = threading.Thread(target=self._loop, name="hf-engine-scheduler", daemon=True)
        self._thread.start()

    # ---- model -------------------------------------------------------------------------------

    def _load(self, path: str):
        """The model at `path` on this engine's device (`loading.load_model`: into a copy of the serving
        model when it is a same-architecture export, else in full)."""
        return loading.load_model(path, self.dtype, self.device, getattr(self, "_model", None), self._copy_of_serving)

    def _copy_of_serving(self):
        """A model to load new weights into beside the serving one: the model the last update retired
        (same architecture; nothing runs on it any more) with the serving weights copied in, or a
        deep copy the first time. Saves the deep copy's Python-object walk at every update."""
        with self._cv:
            spare, self._spare = self._spare, None
        serving = self._model
        if spare is None:
            return copy.deepcopy(serving)
        loading.copy_weights(spare, serving)
        return spare

    @property
    def model_config(self):
        return self._model.config

    def named_parameters(self):
        """The current model's parameters (the weights requests now decode with)."""
        return self._model.named_parameters(remove_duplicate=False)  # tied weights under both names

    @property
    def vocab_size(self) -> int:
        return int(self._model.config.vocab_size)

    # ---- requests ----------------------------------------------------------------------------

    def submit(self, input_ids: list[int], sampling: dict | None = None, return_logprob: bool = False,
               rid: str | None = None, *, logprob_start_len: int = -1, internal: bool = False,
               lora_path: str | None = None) -> Future:
        """Queue one prompt (decoded by the LoRA adapter named `lora_path`, else the base weights);
        the Future resolves to a result dict (see `Request.result`)."""
        return self.submit_many([dict(input_ids=input_ids, sampling=sampling, return_logprob=return_logprob,
                                      rid=rid, logprob_start_len=logprob_start_len, lora_path=lora_path)],
                                internal=internal)[0]

    def submit_many(self, specs: list[dict], *, internal: bool = False) -> list[Future]:
        """Queue several prompts at once (keys as `submit`'s arguments), so they share a batch. A
        `lora_path` naming no loaded adapter raises ValueError and queues nothing. `on_token`: a
        streamed request's listener (`batch.Request.on_token`), called with each token as sampled."""
        prepared = []
        for spec in specs:
            input_ids, sampling = list(spec["input_ids"]), spec.get("sampling") or {}
            if not input_ids:
                raise ValueError("input_ids is empty: give at least one token id")
            problem = context_error(len(input_ids), sampling.get("max_new_tokens"), self.context_length)
            if problem:
                raise ValueError(problem)
            params = GenParams.from_sampling(sampling, prompt_len=len(input_ids), context_length=self.context_length,
                                             eos_ids=self.eos_ids, tokenizer=self.tokenizer)
            prepared.append((spec.get("rid") or uuid.uuid4().hex, input_ids, params, bool(spec.get("return_logprob")),
                             int(spec.get("logprob_start_len", -1)), spec.get("on_token")))
        futures = [Future() for _ in prepared]
        with self._cv:
            if self._closed:
                raise RuntimeError("the engine is closed")
            adapters = [self._adapter_locked(spec.get("lora_path")) for spec in specs]
            for (rid, input_ids, params, want_lp, start, on_token), adapter, future in zip(prepared, adapters, futures):
                self._queue.append(Request(rid, input_ids, params, want_lp, start, future, next(self._seq),
                                           admitted=self._paused is None, internal=internal, adapter=adapter,
                                           on_token=on_token))
            self._cv.notify_all()
        return futures

    def _adapter_locked(self, name: str | None) -> Adapter | None:
        if name is None:
            return None
        adapter = self._adapters.get(name)
        if adapter is None:
            raise ValueError(f"The following requested LoRA adapters are not loaded: {name}\n"
                             f"Loaded adapters: {sorted(self._adapters)}. Load it first with POST /load_lora_adapter.")
        return adapter

    def abort(self, rid: str = "", abort_all: bool = False) -> int:
        """SGLang's abort_request: no-op unless `abort_all` or `rid` is live; then every live request
        whose rid starts with `rid` is aborted. Returns how many were aborted."""
        with self._cv:
            live = self._queue + self._running
            if not abort_all and not any(r.rid == rid for r in live):
                return 0
            return self._abort_locked(lambda r: abort_all or r.rid.startswith(rid))

    def _abort_locked(self, match, message: str = "Aborted") -> int:
        queued = [r for r in self._queue if match(r)]
        self._queue = [r for r in self._queue if not match(r)]
        for r in queued:
            r.weight_version = r.weight_version or self._version_of(r)
            self._complete_locked(r, {**r.result(dict(WAITING_ABORT)), "waiting_abort": True})
        running = [r for r in self._running if match(r) and r.abort_message is None]
        for r in running:
            r.abort_message = message
        self._cv.notify_all()
        return len(queued) + len(running)

    def _version_of(self, req: Request) -> str:
        return req.adapter.current().weight_version if req.adapter is not None else self.weight_version

    def _complete_locked(self, req: Request, result: dict) -> None:
        if not req.internal:
            self.stats.record_request(len(req.input_ids), result["completion_tokens"],
                                      result["finish_reason"]["type"] == "abort", result["e2e_latency"],
                                      cached_tokens=result.get("cached_tokens", 0))
        if not req.future.done():
            req.future.set_result(result)

    # ---- control -----------------------------------------------------------------------------

    def pause(self, mode: str = "abort") -> None:
        """Requests wait while paused. "abort" aborts in-flight requests, "retract" puts running ones
        back in the queue (restarted from scratch on resume), "in_place" holds them mid-batch."""
        if mode not in PAUSE_MODES:
            raise ValueError(f"pause mode must be one of {', '.join(PAUSE_MODES)}; got {mode!r}")
        with self._cv:
            self._paused = mode
            if mode == "abort":
                self._abort_locked(lambda r: r.admitted)
            self._cv.notify_all()
            if mode != "in_place":
                self._cv.wait_for(lambda: not self._running or self._closed, timeout=60)

    def resume(self) -> None:
        with self._cv:
            self._paused = None
            for r in self._queue:
                r.admitted = True
            self._cv.notify_all()

    @property
    def paused(self) -> str | None:
        return self._paused

    @property
    def alive(self) -> bool:
        return not self._closed and self._thread.is_alive()

    def set_weight_version(self, version: str, abort_all_requests: bool = True) -> None:
        with self._cv:
            if abort_all_requests:
                self._abort_locked(lambda r: r.admitted)
            self.weight_version = version

    def flush_cache(self) -> bool:
        """Empty the prefix cache; False (nothing done) while requests are in flight, as SGLang refuses then."""
        with self._cv:
            if self._running or any(r.admitted for r in self._queue):
                return False
            for cache in self._prefix_caches_locked():
                cache.clear()
            return True

    def _prefix_caches_locked(self) -> list[PrefixCache]:
        return [self.prefix_cache, *(a.prefix_cache for a in self._adapters.values())]

    # ---- LoRA adapters -----------------------------------------------------------------------

    def load_lora_adapter(self, name: str, path) -> tuple[bool, str]:
        """Merge the peft adapter at `path` onto a copy of the serving model and serve it as `name`.
        (False, why) when the name is taken or the adapter does not fit; nothing changes then."""
        with self._update_lock:  # not beside a weight update: the adapter is merged onto the base it serves with
            with self._cv:
                if self._closed:
                    return False, "the engine is closed"
                if not name:
                    return False, "lora_name must not be empty"
                if name in self._adapters:
                    return False, f"Failed to load LoRA adapter {name} because it is already loaded"
            try:
                files = read_adapter(path)
                model = merged_model(self._model, files)
            except Exception as exc:  # noqa: BLE001 - any failure means: refuse it, keep serving as before
                return False, f"Failed to load LoRA adapter {name} from {path}: {exc}"
            with self._cv:
                self._adapters[name] = Adapter(name, files, model, self.weight_version,
                                               PrefixCache(self.prefix_cache_tokens))
        log.info("loaded LoRA adapter %s from %s (%d bytes)", name, path, files.bytes)
        return True, ""

    def unload_lora_adapter(self, name: str) -> tuple[bool, str]:
        """Stop serving `name`: new requests for it are refused; those already queued finish on it."""
        with self._cv:
            if self._adapters.pop(name, None) is None:
                return False, f"LoRA with name {name} does not exist. Loaded LoRAs: {sorted(self._adapters)}"
        return True, ""

    def loaded_adapters(self) -> dict[str, str]:
        """Loaded adapter name -> the path it was loaded from (SGLang's `loaded_adapters`)."""
        with self._cv:
            return {name: a.files.path for name, a in self._adapters.items()}

    def _merge_adapters_onto(self, model) -> tuple[list, list, str]:
        """Every loaded adapter merged onto `model` (a new base): ((adapter, merged model) pairs, the
        adapters that do not fit it, a sentence naming those)."""
        with self._cv:
            adapters = list(self._adapters.values())
        merged, dropped = [], []
        for adapter in adapters:
            try:
                merged.append((adapter, merged_model(model, adapter.files)))
            except Exception as exc:  # noqa: BLE001 - an adapter that no longer fits is unloaded, not fatal
                dropped.append(adapter)
                log.warning("LoRA adapter %s does not fit the new weights and is unloaded: %s", adapter.name, exc)
        note = f" LoRA adapter(s) {', '.join(a.name for a in dropped)} did not fit the new weights and were unloaded." \
            if dropped else ""
        return merged, dropped, note

    def update_weights_from_disk(self, model_path, weight_version: str | None = None,
                                 abort_all_requests: bool = False) -> tuple[bool, str]:
        """Load `model_path` beside the serving model, then swap between batches (see module doc)."""
        with self._update_lock:
            try:
                model = self._load(str(model_path))
                if int(model.config.vocab_size) != self.vocab_size:
                    raise ValueError(f"vocab_size {model.config.vocab_size} differs from the serving model's "
                                     f"{self.vocab_size}")
            except Exception as exc:  # noqa: BLE001 - any load failure means: keep the old weights
                return False, f"Failed to update weights: {exc}.\nRolling back to original weights."
            adapters, dropped, note = self._merge_adapters_onto(model)
            problem = self._swap_in(_Swap(model, str(model_path), weight_version, adapters, dropped), abort_all_requests)
        if problem:
            return False, f"Failed to update weights: {problem}."
        message = "Succeeded to update model weights."
        return True, message + (f" Weight version updated to {weight_version}." if weight_version is not None else "") + note

    def update_weights_from_tensors(self, tensors: dict, weight_version: str | None = None,
                                    abort_all_requests: bool = False) -> tuple[bool, str]:
        """Copy `tensors` (parameter name -> full tensor; any subset) into a copy of the serving model,
        then swap it in between batches as `update_weights_from_disk` does. An unknown name or a wrong
        shape changes nothing. The copy costs one extra model in memory during the update, as a disk
        update does."""
        with self._update_lock:
            current = dict(self.named_parameters())
            unknown = sorted(set(tensors) - set(current))
            wrong = [f"{n}: got {tuple(t.shape)}, the model has {tuple(current[n].shape)}"
                     for n, t in tensors.items() if n in current and tuple(t.shape) != tuple(current[n].shape)]
            if unknown or wrong:
                problem = (f"unknown parameter name(s) {unknown[:5]} (names are the model's state-dict keys, e.g. "
                           f"{sorted(current)[:2]})" if unknown else "shape mismatch: " + "; ".join(wrong[:5]))
                return False, f"Failed to update parameter online: {problem}. The weights were not changed."
            model = self._copy_of_serving()
            params = dict(model.named_parameters(remove_duplicate=False))
            with torch.no_grad():
                for name, tensor in tensors.items():
                    params[name].copy_(tensor)
            adapters, dropped, note = self._merge_adapters_onto(model)
            problem = self._swap_in(_Swap(model, self.model_path, weight_version, adapters, dropped), abort_all_requests)
        if problem:
            return False, f"Failed to update parameter online: {problem}."
        return True, "Succeeded to update parameter online." + note

    def _swap_in(self, swap: _Swap, abort_all_requests: bool) -> str | None:
        """Hand a loaded model to the scheduler, which swaps it in between batches; wait for that.
        Returns why it did not happen, or None."""
        with self._cv:
            if self._closed:
                return "the engine is closed"
            swap.barrier = next(self._seq)
            self._swap = swap
            if abort_all_requests:
                self._abort_locked(lambda r: r.admitted)
            self._cv.notify_all()
        swap.done.wait()
        return None if swap.ok else "the engine closed before the swap"

    def snapshot(self) -> dict:
        with self._cv:
            return {"num_running_reqs": len(self._running), "num_queue_reqs": len(self._queue),
                    "weight_version": self.weight_version, "paused": self._paused,
                    "prefix_cache_tokens": sum(c.tokens for c in self._prefix_caches_locked()),
                    "lora_adapters": len(self._adapters), **self.stats.snapshot()}

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._abort_locked(lambda r: True, message="Aborted: the server is shutting down")
            if self._swap is not None:
                self._swap.done.set()
            self._cv.notify_all()
        self._thread.join(timeout=30)

    # ---- hooks called by BatchRun in the scheduler thread -------------------------------------

    def checkpoint(self, active: list[Request]) -> str:
        with self._cv:
            while True:
                if self._closed or self._paused is None:
                    return "run"
                if any(r.abort_message is not None for r in active):
                    return "hold"
                if self._paused == "abort":
                    self._abort_locked(lambda r: r in active)
                    continue
                if self._paused == "retract" or self._swap is not None:
                    return "retract"
                self._cv.wait()

    def finish(self, req: Request, finish_reason: dict) -> None:
        with self._cv:
            if req in self._running:
                self._running.remove(req)
            self._complete_locked(req, req.result(finish_reason))
            self._cv.notify_all()

    def admit(self, room: int) -> list[Request]:
        """Waiting requests that join the running batch: only while no pause or weight swap is pending,
        so a joining request is decoded by the same weights its weight_version names."""
        if room <= 0:
            return []
        with self._cv:
            if self._closed or self._paused is not None or self._swap is not None or not self._queue:
                return []
            adapter = self._running_adapter
            if any(self._serving(r) is not adapter for r in self._queue):
                return []  # a request of other weights waits: let this batch drain, the next one is the oldest's
            joining = self._queue[:room]
            self._queue = self._queue[len(joining):]
            self._running.extend(joining)
            for r in joining:
                r.adapter = adapter
                r.weight_version = self._version_of(r)
            self.stats.batch_joined(len(joining))
            return joining

    def retract(self, reqs: list[Request]) -> None:
        """Put running requests back in the queue, restarted from scratch; a streamed request that has
        sent tokens is aborted with them instead (what a client was sent cannot be taken back)."""
        with self._cv:
            again = []
            for r in reqs:
                if r in self._running:
                    self._running.remove(r)
                if r.on_token is not None and r.output_ids:
                    self._complete_locked(r, r.result({**ABORTED, "message": STREAMED_RETRACT}))
                    continue
                r.reset_for_retry()
                again.append(r)
            self._queue[:0] = sorted(again, key=lambda r: r.seq)
            self._cv.notify_all()

    # ---- scheduler ---------------------------------------------------------------------------

    def _loop(self) -> None:
        with torch.inference_mode():
            while True:
                picked = self._next_batch()
                if picked is None:
                    return
                self._run_batch(*picked)

    def _eligible(self) -> list[Request]:
        if self._paused is not None:
            return []
        if self._swap is None:
            return self._queue
        return [r for r in self._queue if r.seq < self._swap.barrier]

    def _next_batch(self):
        with self._cv:
            while True:
                if self._closed:
                    return None
                if self._swap is not None and not self._running and not self._eligible():
                    self._apply_swap_locked()
                    continue
                eligible = self._eligible()
                if not eligible:
                    self._cv.wait()
                    continue
                # the window restarts while requests keep arriving (many episodes answering at once),
                # bounded so the first one never waits more than MAX_WINDOW_FACTOR windows
                first, last = min(r.arrival for r in eligible), max(r.arrival for r in eligible)
                wait = min(last + self.batch_window_s, first + self.batch_window_s * MAX_WINDOW_FACTOR) - time.monotonic()
                if wait > 0 and len(eligible) < self.max_batch_size:
                    self._cv.wait(wait)
                    continue
                adapter = self._serving(eligible[0])  # one set of weights per batch: the oldest request's
                batch = [r for r in eligible if self._serving(r) is adapter][:self.max_batch_size]
                taken = set(map(id, batch))
                self._queue = [r for r in self._queue if id(r) not in taken]
                self._running = list(batch)
                self._running_adapter = adapter
                self.stats.batch_started(len(batch))
                for r in batch:
                    r.adapter = adapter
                    r.weight_version = self._version_of(r)
                if adapter is None:
                    return batch, self._model, self.prefix_cache
                return batch, adapter.model, adapter.prefix_cache

    @staticmethod
    def _serving(req: Request) -> Adapter | None:
        """The adapter that decodes `req` now: the one it named, merged onto the current base."""
        return req.adapter.current() if req.adapter is not None else None

    def _apply_swap_locked(self) -> None:
        swap, self._swap = self._swap, None
        retired = self._model
        self._model, self.model_path = swap.model, swap.model_path
        self._spare = retired if loading.same_shapes(retired, swap.model) else None
        self.prefix_cache.clear()  # keys and values of the old weights
        if swap.weight_version is not None:
            self.weight_version = swap.weight_version
        for old, model in swap.adapters:  # requests naming `old` are decoded by its new merge from now on
            old.replaced_by = Adapter(old.name, old.files, model, self.weight_version, PrefixCache(self.prefix_cache_tokens))
            if self._adapters.get(old.name) is old:
                self._adapters[old.name] = old.replaced_by
        for old in swap.dropped:
            if self._adapters.get(old.name) is old:
                del self._adapters[old.name]
            self._abort_locked(lambda r, old=old: self._serving(r) is old,
                               message=f"Aborted: LoRA adapter {old.name} does not fit the new weights")
        self.eos_ids = loading.eos_ids(self._model, self.tokenizer)
        swap.ok = True
        swap.done.set()
        self._cv.notify_all()

    def _run_batch(self, batch: list[Request], model, prefix_cache: PrefixCache) -> None:
        started, generated = time.perf_counter(), 0
        try:
            generated = BatchRun(model, self.tokenizer, batch, self, pad_id=self.pad_id, max_rows=self.max_batch_size,
                                 prefix_cache=prefix_cache, stats=self.stats, lean=self.lean_decode).run()
        except Exception as exc:  # noqa: BLE001 - fail this batch's requests, keep serving
            log.exception("batch of %d requests failed", len(batch))
            with self._cv:
                for r in self._running:
                    if not r.future.done():
                        r.future.set_exception(exc)
        finally:
            with self._cv:
                self._running, self._running_adapter = [], None
                self.stats.record_batch(generated, time.perf_counter() - started)
                self._cv.notify_all()
