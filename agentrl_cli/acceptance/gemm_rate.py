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
    over the KV cache, norms, activations, sampling, and the prompt's prefill."""
    import torch

    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(0)
        weights = [torch.randn(o, i, generator=gen) for _, i, o in shapes]  # nn.Linear's [out, in]
        transposed = [w.t().contiguous() for w in weights]  # [in, out]
        inputs = {i: torch.randn(batch, i, generator=gen) for _, i, _ in shapes}
        outs = [torch.empty(batch, w.shape[0]) for w in weights]

        def linear() -> None:
            for w, out in zip(weights, outs):
                torch.mm(inputs[w.shape[1]], w.t(), out=out)

        def matmul() -> None:
            for w, out in zip(transposed, outs):
                torch.matmul(inputs[w.shape[0]], w, out=out)

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
    median = medians[layout]
    n = sum(i * o for _, i, o in shapes)
    return {"batch": batch, "threads": used, "steps": len(calls[layout]), "step_s": median, "layout": layout,
            "layout_step_s": medians, "tokens_per_s": batch / median, "gflops": 2.0 * n * batch / median / 1e9}


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
