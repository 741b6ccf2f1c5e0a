"""Stage 0 - baseline.

The smallest setup through the whole loop: the configured model, two GRPO groups of training
tasks, the embedded (or configured) inference server, the reward, one DeepSpeed train step per
group batch and a verified weight sync after each step. Records the time shares of sampling,
training and sync (judged: these timers and the checkpoint's must cover the loop's wall time), generated tokens/s as
throughput and per stream, samples/min, the inference server's busy fraction and queue length,
environment step latency and failure rate, and the loss into `runs/<run_id>/baseline.json`, which
`agentrl verify` measures again and compares. The baseline also carries, as figures (not judged),
the per-sample cost that `benchmarks/peer_trl.py` compares with TRL: trained samples/s over the
loop's wall time, and the per-step breakdown (on the trainer's path: waiting for samples, train
step, weight sync, checkpoint, the rest; beside it, summed over episodes: generation, reward, store
writes, environment), so a user's own machine reports them. Where the time goes, per step, beside
each phase's lower bound on this machine (`agentrl_cli/acceptance/phases.py`: generation's prefill
and decode with their tokens and batch occupancy from the server's own counters, scoring, the
trainer's forward, backward and optimizer step, weight sync, and idle on each side; the bounds from
model FLOPs at the GEMM rate measured after the loop) is reported as `info`, not judged.
"""

from __future__ import annotations

import json
import math

from agentrl_cli.acceptance.baseline import STEPS, measure
from agentrl_cli.acceptance.context import StageContext
from agentrl_cli.acceptance.phases import compact
from agentrl_cli.runtime.observe import keys
from agentrl_cli.weightsync.base import Published
from agentrl_cli.core.report import Check, StageReport, atomic_write_text

MIN_TIMED_FRACTION = 0.8  # the timed phases must account for most of the loop's wall time


def run(ctx: StageContext) -> StageReport:
    checks, baseline = ctx.produce("whole loop once: rollout, reward, train step, weight sync", lambda: loop_once(ctx))
    if not baseline:
        return ctx.report(checks + [Check.skipped("baseline figures", "the loop did not complete; see above")])
    atomic_write_text(ctx.run.path / "baseline.json", json.dumps(baseline, indent=2) + "\n")
    checks += figure_checks(baseline)
    return ctx.report(checks, [f"baseline written to {ctx.run.path / 'baseline.json'}"], environment={"baseline": baseline})


def loop_once(ctx: StageContext) -> tuple[Check, dict]:
    """The loop's check, and its figures for the checks after it ({} when no step completed)."""
    summary, figures = measure(ctx.config, ctx.run.path / "stage0", ctx.run.run_id, ctx.progress)
    synced = [s for s in summary.syncs if Published.verified(s)]
    losses = [m.get(keys.TRAIN_LOSS) for m in summary.metrics]
    ok = summary.steps == STEPS and len(synced) == STEPS and all(isinstance(x, float) and math.isfinite(x) for x in losses)
    return Check.judge("whole loop once: rollout, reward, train step, weight sync", ok,
                       {"steps": summary.steps, "verified_syncs": len(synced), "losses": losses},
                       f"{STEPS} steps, each followed by a verified weight sync, finite loss",
                       "see runs/<run_id>/stage0/logs and metrics.jsonl; run stages 4-6 to narrow it down"), figures


def figure_checks(baseline: dict) -> list[Check]:
    shares, coverage = baseline["time_shares"], baseline["timed_fraction"]
    return [
        Check.judge("phase timers cover the loop", coverage >= MIN_TIMED_FRACTION,
                    {"timed_fraction": round(coverage, 3), "wall_s": baseline["wall_s"], "shares": _round(shares)},
                    f"sampling + training + sync + checkpoint >= {MIN_TIMED_FRACTION:.0%} of the loop's wall time",
                    "time outside the timed phases (re-syncs, evaluation, waits) makes the shares misleading; "
                    "see metrics.jsonl (time/*) against elapsed_s"),
        Check.info("time shares (sampling / training / sync)", _round(shares), "what verify compares later runs with"),
        (Check.info("where the time goes (s per step; lower bound and ratio beside each phase)",
                    compact(baseline["phases"]["mean"]),
                    f"bounds at {baseline['phases']['rates']['gemm_gflops']} GFLOP/s ({baseline['phases']['rates']['bounds']}) "
                    "measured after the loop; "
                    "baseline.json `phases` has each step")
         if baseline.get("phases", {}).get("mean") else Check.skipped("where the time goes (s per step; lower bound and ratio beside each phase)", "no step's phases were recorded")),
        Check.judge("tokens generated", baseline["tokens_generated"] > 0, baseline["tokens_generated"], "> 0",
                    "no tokens were generated: see stage 4"),
        Check.info("tokens/s: throughput and per stream",
                   {"throughput": round(baseline["tokens_per_s"], 1), "per_stream": round(baseline["tokens_per_s_per_stream"], 1)},
                   "throughput: tokens over the sampling phase's wall time; per stream: over the summed generation "
                   "time of the episodes (one episode's rate)"),
        Check.judge("environment steps ran", baseline["env_steps"] > 0,
                    {"steps": baseline["env_steps"], "latency_s": round(baseline["env_step_latency_s"], 4)},
                    "> 0 environment steps (latency recorded)", "no environment step ran: see stage 5"),
        (Check.judge("episodes token-exact", baseline["token_exact"]["episodes"] > 0 and baseline["token_exact"]["mismatches"] == 0,
                     baseline["token_exact"], "0 tokens differ between each episode's ids and a fresh render of its conversation",
                     "the model's chat template does not round-trip (it rewrites earlier turns or trims text): import the model "
                     "with a fixed template (`agentrl model import SOURCE --chat-template FILE`)")
         if baseline.get("token_exact") else Check.skipped("episodes token-exact", "baseline.json predates the token-exact check")),
    ]


def _round(d: dict) -> dict:
    return {k: round(v, 3) for k, v in d.items()}
