"""`verify` and the stages' thresholds. One module per section; `agentrl_cli/config/models.py` joins them."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from agentrl_cli.config.sections.base import (Section)


SHORT_RECIPE = {
    "rollout.mode": "sync", "rollout.weight_sync_interval_steps": 1, "rollout.group_size": 8, "rollout.curriculum": True,
    "training.micro_batch_size": 8, "training.gradient_accumulation_steps": 4,
    "training.learning_rate": 3e-4, "training.kl_coef": 0.1, "rollout.eval_concurrency": 1,
}


class StageThresholds(Section):
    """Pass/fail thresholds the stage checks compare their measurements with."""

    allreduce_min_gbps: float = Field(0.05, ge=0, description="Stage 1: minimum all-reduce bus bandwidth (GB/s)")
    checkpoint_write_min_mbps: float = Field(50.0, ge=0, description="Stage 1: minimum checkpoint-dir write bandwidth (MB/s)")
    small_files_min_per_s: float = Field(200.0, ge=0, description="Stage 1: minimum small-file creates per second")
    allreduce_ranks: int = Field(0, ge=0, le=4096, description="Stage 1: all-reduce ranks on this host (0 = one per GPU, or 2 without GPUs)")
    allreduce_max_mb: float = Field(4.0, gt=0, le=16384, description="Stage 1: largest all-reduce message (MiB); sizes go up from 4 KiB in steps of x16")
    allreduce_timeout_s: float = Field(120.0, gt=0, description="Stage 1: deadline for the all-reduce run; ranks still running then are killed and named")
    storage_probe_mb: int = Field(64, ge=1, description="Stage 1: bytes written (MiB) to measure checkpoint-dir write bandwidth")
    small_files_count: int = Field(500, ge=10, description="Stage 1: files created to measure the small-file rate")
    inference_min_tokens_per_s: float = Field(50.0, ge=0, description="Stage 4: minimum generated tokens/s under load")
    inference_max_p99_ms: float = Field(30_000.0, gt=0, description="Stage 4: maximum p99 request latency (ms)")
    inference_load_concurrency: int = Field(32, ge=1, description="Stage 4: concurrent requests in the load test")
    logprob_max_abs_diff: float = Field(1e-3, gt=0, description="Stage 4: log-probs vs forward pass, max abs difference")
    sandbox_concurrency: int = Field(16, ge=1, description="Stage 5: sandboxes created at once")
    reward_min_scores_per_s: float = Field(20.0, ge=0, description="Stage 6: minimum reward-service throughput")
    data_min_compression_ratio: float = Field(2.0, ge=1, description="Stage 7: minimum Parquet compression ratio")
    smoke_steps: int = Field(20, ge=1, description="Stage 8 smoke: trainer steps")
    short_minutes: float = Field(15.0, gt=0, description="Stage 8 short: time budget in minutes")
    short_eval_every_steps: int = Field(20, ge=1, description="Stage 8 short and full, and verify's own run: trainer steps between evaluations (the curve)")
    full_minutes: float | None = Field(None, gt=0, description="Stage 8 full: time budget in minutes (training stops at it or at training.total_steps, whichever comes first); null: training.total_steps alone")
    full_max_success_drop: float = Field(0.05, ge=0, le=1, description="Stage 8 full: how far the mean eval success of the last third of the run's evaluations may fall below that of its best third (the curve split in three), on the training harnesses")
    full_min_entropy: float | None = Field(None, gt=0, le=20, description="Stage 8 full: the mean token entropy (nats, at the sampling temperature) the policy must stay above: judged on the median of every 5 consecutive steps; null: judged as short's is, the last steps' median within 0.1x-10x of the first steps'")
    short_min_success_gain: float = Field(0.15, ge=0, le=1, description="Stage 8 short: required eval success-rate gain over the warm start")
    short_recipe: dict[str, Any] | None = Field(
        default_factory=lambda: dict(SHORT_RECIPE),
        description="Stage 8 short: config overrides (dotted keys) for the run, the built-in tiny model's GRPO recipe; a mapping given replaces the whole recipe, null runs the config as it is")


class VerifyConfig(Section):
    """What `agentrl verify` compares its measurements with."""

    minutes: float = Field(5.0, gt=0, description="Time budget of the verification run verify starts when no run has training to judge (the stage 8 short recipe); it trains at least 3 steps")
    eval_tasks_per_family: int = Field(3, ge=1, description="Eval-split tasks of every task family the verification run evaluates before and after training")
    max_reward_variance: float = Field(0.01, ge=0, description="Largest variance of one task's reward over repeated runs with the same seed")
    baseline_max_drift: float = Field(0.5, gt=0, description="Largest relative deviation of a performance figure from the stage-0 baseline")
    cross_harness_max_drop: float = Field(0.3, ge=0, le=1, description="Largest amount the held-out harness may fall behind the training harnesses during training: their mean success gain minus its own")
