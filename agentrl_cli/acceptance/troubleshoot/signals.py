"""Every signal name the knowledge base may cite, and where the runtime produces it.

- METRICS: keys of a training run's `metrics.jsonl` rows (named in `agentrl_cli/runtime/observe/keys.py`;
  `train/*` come from the learner's `train_step`, `env/…` from the harness service levels, `gateway/…`
  from the run's recording gateway, `agentrl_cli/engines/gateway/`). A name
  with `<…>` stands for one key per harness, error, tool or status.
- BASELINE: figures of the stage-0 loop (`baseline.json`, and verify's `verify/probe.json`), by path.
- DERIVED: figures the run diagnosis computes from rows, trajectories, logs, reports and the store
  (`detectors.py` produces each under this name).
"""

from __future__ import annotations

METRICS = frozenset({
    "train/loss", "train/grad_norm", "train/entropy", "train/clip_fraction", "train/approx_kl", "train/mismatch_kl",
    "train/kl_ref", "train/lr",
    "reward/mean", "reward/std", "reward/success_rate", "reward/masked",
    "time/sampling_wait_s", "time/train_s", "time/sync_s",
    "rollout/staleness_mean", "rollout/tokens_generated", "rollout/in_flight", "rollout/buffer_fill", "rollout/dropped_stale",
    "rollout/backpressure_waits", "rollout/env_failures", "rollout/episode_errors", "rollout/aborted_generations",
    "rollout/resumed_generations", "rollout/wasted_tokens", "rollout/server_retries", "rollout/weight_resyncs",
    "rollout/infra_errors", "rollout/goodput", "watchdog/stuck_now",
    "eval/<harness>/success_rate", "env/<harness>/create_failures/<error>", "env/<harness>/tool/<tool>/<status>",
    "env/<harness>/harness_errors/<method>", "gateway/calls", "gateway/malformed_tool_calls",
    "gateway/<harness>/malformed_tool_calls",
})

BASELINE = {
    "perf/time_share_sampling": ("time_shares", "sampling"),
    "perf/time_share_training": ("time_shares", "training"),
    "perf/time_share_sync": ("time_shares", "sync"),
    "perf/tokens_per_s": ("tokens_per_s",),
    "perf/samples_per_min": ("samples_per_min",),
    "perf/server_busy_fraction": ("server_busy_fraction",),
    "perf/inference_queue_len": ("inference_queue_len_mean",),
    "perf/env_step_latency_s": ("env_step_latency_s",),
    "perf/env_failure_rate": ("env_failure_rate",),
}

DERIVED = frozenset({
    "reward/max_fraction", "canary/positive", "env/initial_observation_variants", "env/creation_errors", "env/harness_errors",
    "tool/failure_rate", "tool/failures_by_status", "traj/turns_p99_over_median", "traj/truncated_fraction",
    "traj/invalid_action_rate", "data/store_bytes", "data/store_growth_mb_per_hour", "data/hours_to_disk_full",
    "verify/repeat_reward_variance", "alert/firing",
})

ALL = METRICS | frozenset(BASELINE) | DERIVED
