"""Stage 0 - baseline.

The smallest setup through the whole loop: the configured model, two GRPO groups of training
tasks, the embedded (or configured) inference server, the reward, one DeepSpeed train step per
group batch and a verified weight sync after each step. Records the time shares of sampling,
training and sync, generated tokens/s, environment step latency and the loss into
`runs/<run_id>/baseline.json`, which `agentrl verify` compares later runs with.
"""

from __future__ import annotations

import asyncio
import json
import math

from agentrl_cli.context import StageContext
from agentrl_cli.report import Check, StageReport, atomic_write_text

STEPS = 2


def baseline_config(cfg):
    """The smallest loop: groups of 2, one micro-batch of 4 per step, a sync after every step."""
    return cfg.model_copy(update={
        "rollout": cfg.rollout.model_copy(update={"group_size": 2, "concurrency": min(cfg.rollout.concurrency, 8),
                                                  "weight_sync_interval_steps": 1, "mode": "sync",
                                                  "max_steps_per_trajectory": min(cfg.rollout.max_steps_per_trajectory, 4)}),
        "training": cfg.training.model_copy(update={"micro_batch_size": 4, "gradient_accumulation_steps": 1,
                                                    "checkpoint_interval_steps": 10_000, "resume_from_latest": False,
                                                    "world_size": 1}),
    })


def run(ctx: StageContext) -> StageReport:
    from agentrl_cli.model.resolve import resolve_model_path
    from agentrl_cli.run import TrainingRun

    cfg = baseline_config(ctx.config)
    state: dict = {}

    def loop() -> Check:
        ctx.progress("resolving the model (the built-in one is built on first use, about 10 minutes on 2 cores)")
        path = resolve_model_path(cfg.model.path, cfg.model.cache_dir)

        async def go():
            training = TrainingRun(cfg, ctx.run.path / "stage0", path, run_id=ctx.run.run_id, phase="baseline",
                                   progress=ctx.progress)
            try:
                await training.start()
                return await training.run(STEPS)
            finally:
                await training.close()
        summary = asyncio.run(go())
        state["summary"] = summary
        synced = [s for s in summary.syncs if s["verified_tensors"] > 0]
        losses = [m.get("train/loss") for m in summary.metrics]
        ok = summary.steps == STEPS and len(synced) == STEPS and all(isinstance(x, float) and math.isfinite(x) for x in losses)
        return Check.judge("whole loop once: rollout, reward, train step, weight sync", ok,
                           {"steps": summary.steps, "verified_syncs": len(synced), "losses": losses},
                           f"{STEPS} steps, each followed by a verified weight sync, finite loss",
                           "see runs/<run_id>/stage0/logs and metrics.jsonl; run stages 4-6 to narrow it down")

    checks = [ctx.check("whole loop once: rollout, reward, train step, weight sync", loop)]
    summary = state.get("summary")
    if summary is None or not summary.metrics:
        return ctx.report(checks + [Check.skipped("baseline figures", "the loop did not complete; see above")])
    baseline = _figures(summary)
    atomic_write_text(ctx.run.path / "baseline.json", json.dumps(baseline, indent=2) + "\n")
    shares = baseline["time_shares"]
    checks.append(Check.judge("time shares", abs(sum(shares.values()) - 1.0) < 1e-6 and all(v >= 0 for v in shares.values()),
                              shares, "sampling + training + sync = 1", "the phase timers are broken"))
    checks.append(Check.judge("generated tokens/s", baseline["tokens_per_s"] > 0, round(baseline["tokens_per_s"], 1),
                              "> 0", "no tokens were generated: see stage 4"))
    checks.append(Check.judge("environment step latency", baseline["env_step_latency_s"] > 0,
                              round(baseline["env_step_latency_s"], 4), "measured (> 0)", "no environment step ran: see stage 5"))
    return ctx.report(checks, [f"baseline written to {ctx.run.path / 'baseline.json'}"], environment={"baseline": baseline})


def _figures(summary) -> dict:
    sampling = sum(m["time/sampling_wait_s"] for m in summary.metrics)
    training = sum(m["time/train_s"] for m in summary.metrics)
    sync = sum(m["time/sync_s"] for m in summary.metrics)
    total = sampling + training + sync or 1.0
    c, t = summary.counters, summary.timers
    episodes = sum(v for k, v in c.items() if k.startswith("termination_"))
    return {
        "steps": summary.steps,
        "time_shares": {"sampling": sampling / total, "training": training / total, "sync": sync / total},
        "seconds": {"sampling": round(sampling, 3), "training": round(training, 3), "sync": round(sync, 3)},
        "tokens_generated": c.get("tokens_generated", 0),
        "tokens_per_s": c.get("tokens_generated", 0) / t["generate_s"] if t.get("generate_s") else 0.0,
        "env_step_latency_s": t.get("env_s", 0.0) / max(1, c.get("env_calls", 0)),
        "episodes": episodes,
        "loss": [m.get("train/loss") for m in summary.metrics],
        "reward_mean": [m.get("reward/mean") for m in summary.metrics],
    }
