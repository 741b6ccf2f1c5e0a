"""This machine's matrix-multiply throughput and the model-FLOP count of a training loop's work,
the two halves of "what share of the machine's GEMM throughput does a loop achieve".

`measure_gemm` times fp32 `torch.matmul` of two square matrices, repeated for a few seconds with a
given torch thread count. `model_flops` counts what a model must compute, per token, for GRPO's
work (the convention of the PaLM paper's model-FLOPs utilisation):

- N = weights of every matrix multiply in the model (each `nn.Linear`, the output head included
  even when tied to the embedding; the embedding lookup is no multiply and is not counted);
  N_A = LoRA adapter weights, r x (in + out) for each adapted `nn.Linear` (0 without LoRA).
- generated token: one forward, 2 (N + N_A) (so counted whether a server applies the adapter beside
  the base weights or merged into them).
- trained token (every token of a trained sequence, prompt included: the training forward runs
  over all of them): forward 2 (N + N_A) plus backward. Full fine-tuning: backward 4N (gradients of
  the activations and of every weight), 6N in all. LoRA: the frozen base needs the activation
  gradients (2N) but no weight gradients; the adapters need both (4 N_A): 4N + 6 N_A in all.
- not counted: the prompt's prefill during generation, attention's score and value products
  (4 x layers x width x context per token, about 3% of a forward at a few hundred tokens of context),
  norms, activations, softmax, the optimizer, padding, and anything an implementation recomputes.

Stage 0 (`acceptance/phases.py`) and the benchmarks (`benchmarks/gemm.py` re-exports these) use them.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path


def measure_gemm(size: int = 2048, seconds: float = 2.0, threads: int = 0) -> dict:
    """fp32 C = A @ B (size x size), repeated for `seconds` after one warm-up call; FLOP/s from the
    median call (robust to a neighbour's burst) and from the fastest. threads 0 = torch's default."""
    import torch

    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(0)
        a, b = torch.randn(size, size, generator=gen), torch.randn(size, size, generator=gen)
        c = torch.empty(size, size)
        torch.matmul(a, b, out=c)
        calls: list[float] = []
        start = time.perf_counter()
        while time.perf_counter() - start < seconds or len(calls) < 3:
            t = time.perf_counter()
            torch.matmul(a, b, out=c)
            calls.append(time.perf_counter() - t)
        used = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    flop = 2.0 * size ** 3
    return {"size": size, "threads": used, "calls": len(calls), "seconds": round(sum(calls), 3),
            "gflops": flop / statistics.median(calls) / 1e9, "best_gflops": flop / min(calls) / 1e9}


def linear_shapes(model_dir: Path) -> list[tuple[str, int, int]]:
    """(module name, in features, out features) of every `nn.Linear` of the model at `model_dir`,
    built on the meta device from its config (no weights read)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return [(name, m.in_features, m.out_features) for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)]


def decode_bound(shapes: list[tuple[str, int, int]], batch: int, seconds: float = 2.0, threads: int = 0) -> dict:
    """The GEMM-bound decode rate of a model at `batch` concurrent streams on this machine: one decode
    step of every stream is, at the least, each of the model's `nn.Linear` multiplies at `batch` rows
    (fp32, random weights of the model's shapes, the output head included); those multiplies are
    timed back to back for `seconds`, and the bound is `batch` tokens per median step. The weights
    are timed in both layouts, steps alternating: [out, in] as `nn.Linear` stores them (`torch.mm(x,
    w.t())`, what the model computes) and [in, out] (`torch.matmul(x, w)`); the faster one's median
    is the bound (`layout` says which; on this project's 2-core AVX-512 box [out, in] ran 7-9% faster
    at 64 rows of SmolLM2). Not counted (so the bound is above what any engine reaches): attention
    over the KV cache, norms, activations, sampling, and the prompt's prefill (`prefill_bound`)."""
    timed = _time_linears([(i, o, batch) for _, i, o in shapes], seconds, threads)
    n = sum(i * o for _, i, o in shapes)
    return {"batch": batch, "tokens_per_s": batch / timed["step_s"], "gflops": 2.0 * n * batch / timed["step_s"] / 1e9,
            **timed}


def output_head(shapes: list[tuple[str, int, int]]) -> str:
    """The name of the model's output head among `shapes`: the `nn.Linear` named `lm_head` (transformers'
    causal LMs), else the one with the most outputs (the vocabulary)."""
    named = [name for name, _, _ in shapes if name.rsplit(".", 1)[-1] == "lm_head"]
    return named[0] if named else max(shapes, key=lambda s: s[2])[0]


def prefill_bound(shapes: list[tuple[str, int, int]], prompt_tokens: int, prompts: int, seconds: float = 1.0,
                  threads: int = 0) -> dict:
    """The least time this machine's multiplies take for the prefill of `prompts` prompts of
    `prompt_tokens` tokens in all: every `nn.Linear` but the output head at `prompt_tokens` rows (one a
    prompt token), and the output head at `prompts` rows (each prompt's last position, which gives its
    first generated token); fp32, timed back to back for `seconds` as `decode_bound` times a step, the
    faster layout's median: {"prefill_s", "gflops", ...}."""
    head = output_head(shapes)
    rows = [(i, o, prompts if name == head else prompt_tokens) for name, i, o in shapes]
    timed = _time_linears(rows, seconds, threads)
    flop = sum(2.0 * i * o * r for i, o, r in rows)
    return {"prompt_tokens": prompt_tokens, "prompts": prompts, "prefill_s": timed["step_s"],
            "gflops": flop / timed["step_s"] / 1e9, **timed}


def batch_bound(decode: dict, prefill: dict, tokens: int) -> dict:
    """The GEMM-bound rate of serving a whole batch on this machine: `tokens` generated for
    `prefill["prompts"]` requests, the prompts prefilled first (`prefill_bound`) and every later token
    one decode step of every request (`decode_bound` at that many rows): each request's first token
    comes from its prefill, so the decode steps give the other `tokens - prompts`. The least time
    (`seconds`) is the prefill's plus those steps'; the bound is `tokens` over it. Attention, norms and
    sampling are still left out, so no engine reaches it."""
    rows = prefill["prompts"]
    seconds = prefill["prefill_s"] + (tokens - rows) / rows * decode["step_s"]
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
            "prefill_share": prefill["prefill_s"] / seconds}


def _time_linears(rows: list[tuple[int, int, int]], seconds: float, threads: int) -> dict:
    """Time `x @ w.t()` for every (in, out, rows) back to back, in both weight layouts with the steps
    alternating, for `seconds` (at least three steps a layout): {"step_s" (the faster layout's median),
    "layout", "layout_step_s", "steps", "threads"}."""
    import torch

    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(0)
        weights = [torch.randn(o, i, generator=gen) for i, o, _ in rows]  # nn.Linear's [out, in]
        transposed = [w.t().contiguous() for w in weights]  # [in, out]
        inputs = {(i, r): torch.randn(r, i, generator=gen) for i, _, r in rows}
        outs = [torch.empty(r, o) for _, o, r in rows]
        xs = [inputs[(i, r)] for i, _, r in rows]

        def linear() -> None:
            for x, w, out in zip(xs, weights, outs):
                torch.mm(x, w.t(), out=out)

        def matmul() -> None:
            for x, w, out in zip(xs, transposed, outs):
                torch.matmul(x, w, out=out)

        layouts = {"out_in": linear, "in_out": matmul}
        calls: dict[str, list[float]] = {name: [] for name in layouts}
        for step in layouts.values():
            step()
        start = time.perf_counter()
        while time.perf_counter() - start < seconds or min(map(len, calls.values())) < 3:
            for name, step in layouts.items():
                t = time.perf_counter()
                step()
                calls[name].append(time.perf_counter() - t)
        used = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    medians = {name: statistics.median(c) for name, c in calls.items()}
    layout = min(medians, key=medians.get)
    return {"threads": used, "steps": len(calls[layout]), "step_s": medians[layout], "layout": layout,
            "layout_step_s": medians}


def model_flops(shapes: list[tuple[str, int, int]], lora_rank: int = 0, lora_targets: list[str] | tuple[str, ...] = ()) -> dict:
    """Per-token model FLOPs (module docstring) from the model's `nn.Linear` shapes."""
    n = sum(i * o for _, i, o in shapes)
    targets = set(lora_targets)
    n_a = sum(lora_rank * (i + o) for name, i, o in shapes if name.rsplit(".", 1)[-1] in targets) if lora_rank else 0
    trained = 4 * n + 6 * n_a if lora_rank else 6 * n
    return {"matmul_weights": n, "adapter_weights": n_a, "per_generated_token": 2 * (n + n_a), "per_trained_token": trained,
            "formula": ("generated token 2(N+N_A); trained token 2(N+N_A) forward + 2N + 4N_A backward = 4N + 6N_A (LoRA: no weight "
                        "gradients of the frozen base)") if lora_rank else "generated token 2N; trained token 6N (full fine-tuning)"}


def sample_flops(flops: dict, sequence_tokens: float, model_tokens: float) -> float:
    """Model FLOPs of one trained sample with `model_tokens` generated tokens in a `sequence_tokens` sequence."""
    return model_tokens * flops["per_generated_token"] + sequence_tokens * flops["per_trained_token"]
