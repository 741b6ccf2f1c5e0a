"""`rollout`: the asynchronous rollout - concurrency, staleness, deadlines, sampling. One module per section; `agentrl_cli/config/models.py` joins them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from agentrl_cli.config.sections.base import (Section)


class RolloutConfig(Section):
    concurrency: int = Field(64, ge=1, le=100_000, description="Episodes in flight at once (typical on GPUs: 256)")
    max_steps_per_trajectory: int = Field(8, ge=1, le=10_000, description="Turn limit per episode; hitting it records `truncated`")
    step_timeout_seconds: float = Field(60.0, gt=0, le=86_400, description="Deadline for one environment step")
    opponent_timeout_s: float = Field(60.0, gt=0, le=86_400, description="Deadline for one generation request to a fixed opponent's inference server (harnesses[].roles naming a URL)")
    allow_partial_resume: bool = Field(True, description="Resume interrupted generations from their saved token prefix")
    resume_max_attempts: int = Field(8, ge=0, le=1000, description="Re-sends of one interrupted generation before its episode is infra_error")
    resume_deadline_s: float = Field(300.0, gt=0, description="Seconds from a generation's first failure to giving up (covers a server restart)")
    weight_sync_interval_steps: int = Field(4, ge=1, description="Trainer steps between weight syncs to the inference servers")
    max_harness_errors: int = Field(8, ge=0, description="Episodes in a row a harness's own code may fail (an exception in reset, step, evidence, compute_reward, system_prompt or tools: the episode is masked as infra_error and counted) before the run stops with exit 1; 0 = never stop")
    max_harness_error_rate: float = Field(0.5, gt=0, le=1, description="Share of a harness's last harness_error_window episodes that may fail in its own code before the run stops with exit 1 (1 = only a window where every episode failed)")
    harness_error_window: int = Field(50, ge=0, description="Episodes per harness over which max_harness_error_rate is judged (judged once the window is full); 0 = no rate limit")
    max_staleness: int = Field(2, ge=0, description="Drop trajectories more than this many policy versions old")
    batch_window_ms: float = Field(10.0, ge=0, le=10_000, description="Inference batching window: requests arriving within it share a forward pass")
    mode: Literal["async", "sync"] = Field("async", description="async: rollout runs ahead of training; sync: generate a batch, then train")
    group_size: int = Field(4, ge=1, le=1024, description="GRPO group: samples per task")
    buffer_size: int = Field(256, ge=1, description="Most episodes held at once, in flight plus buffered for the trainer (new ones wait: backpressure); lowered to what rollout.max_buffer_mb holds when that is fewer (`agentrl plan` shows which binds)")
    max_buffer_mb: float = Field(1024.0, gt=0, le=16_777_216, description="Memory budget (MiB) for the episodes the rollout holds, in flight plus buffered: they are limited to floor(budget / (model.context_length x 17 B + 16 KiB)) (token ids, loss mask, log-probs and text per token, plus the record), or rollout.buffer_size if fewer; a budget that holds no episode is refused; `agentrl plan` prints the derivation")
    max_inference_queue: int = Field(512, ge=1, description="New episodes wait while more generation requests than this are in flight to the inference servers")
    dynamic_sampling: bool = Field(False, description="DAPO dynamic sampling: a group whose trained rewards are all equal (no GRPO signal) is dropped before its step, which takes more groups instead; a step left with none trains nothing and is counted (rollout/skipped_steps)")
    max_refill_rounds: int = Field(3, ge=0, le=100, description="Dynamic sampling: most rounds of taking (in sync mode, generating) more groups to replace a step's dropped ones; past that the step trains on the groups with signal it has")
    truncation: Literal["mask", "score", "penalize"] = Field("score", description="Episodes cut at max_steps_per_trajectory or training.seq_len_limit: mask = never trained on; score = trained on with their reward; penalize = trained on with reward -1")
    env_create_retries: int = Field(2, ge=0, le=20, description="Retries of a failed environment creation (reset) before the episode is masked as infra_error")
    env_create_backoff_s: float = Field(0.5, ge=0, le=60, description="Wait before the first retry of an environment creation; doubled each retry")
    env_busy_timeout_s: float = Field(600.0, ge=0, le=86_400, description="Longest an episode waits for a session while its environment's server refuses new ones at capacity (OpenEnv CAPACITY_REACHED, HTTP 429 or 503 with Retry-After), retrying after env_create_backoff_s doubled each time (at most 10 s, or the server's Retry-After); counted as env/<harness>/backpressure, never a harness error; past it the episode is masked as infra_error (environment_busy)")
    curriculum: bool = Field(False, description="Sample (family, difficulty) buckets by learnability p(1-p) of their recent success rate")
    eval_concurrency: int = Field(0, ge=0, description="Evaluation episodes in flight at once; 0 = all (fast, but greedy near-ties can flip with the batch's make-up); 1 = one at a time, so the same weights always score the same")
    seed: int = Field(1234, description="Seed for the task sampler")
