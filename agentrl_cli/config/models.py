"""The typed platform configuration: one pydantic model per section of `agentrl.yaml`.

Every field has a one-line description and a default that works on one 2-core CPU box with the
embedded parts. The seed documents' keys keep their names (`rollout.concurrency`,
`max_steps_per_trajectory`, `harnesses[].image_tag`, `training.seq_len_limit`, ...).
Loading, merging and error formatting live in `load.py`; nothing here reads files.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator


class Section(BaseModel):
    """Base for every section: unknown keys are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelConfig(Section):
    path: str = Field("builtin:tiny-agent", description="Hugging Face model directory, or builtin:tiny-agent for the built-in tiny model")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="Parameter dtype for inference and training (float32 on CPU)")
    cache_dir: str = Field("~/.cache/agentrl", description="Where the built-in model and other artefacts are cached")
    context_length: int = Field(2048, ge=64, le=1_048_576, description="Maximum tokens of prompt plus completion")
    trust_remote_code: bool = Field(False, description="Allow model code from the model directory (off unless you trust it)")


class InferenceConfig(Section):
    engine: Literal["hf", "sglang"] = Field("hf", description="hf = embedded server on this host; sglang = SGLang servers")
    host: str = Field("127.0.0.1", description="Address the inference server binds to")
    port: int = Field(30000, ge=1, le=65535, description="Port of the first inference server (replicas take the next ports)")
    replicas: int = Field(1, ge=1, le=1024, description="Number of inference servers; more than one puts the SGLang router in front")
    router_policy: Literal["round_robin", "random", "cache_aware", "power_of_two", "least_loaded"] = Field(
        "round_robin", description="How requests are spread over replicas")
    urls: list[str] = Field(default_factory=list, description="Use already running servers at these URLs instead of starting any")
    python: str = Field("python3", description="Interpreter that has SGLang installed (SGLang often lives in its own environment)")
    tp_size: int = Field(1, ge=1, description="Tensor-parallel size per server (SGLang)")
    dp_size: int = Field(1, ge=1, description="Data-parallel size per server (SGLang)")
    mem_fraction_static: float | None = Field(None, gt=0, lt=1, description="Fraction of GPU memory for weights and KV cache (SGLang; None = automatic)")
    max_running_requests: int | None = Field(None, ge=1, description="Cap on concurrently running requests per server (None = automatic)")
    api_key: SecretStr | None = Field(None, description="Bearer token the servers require (never written to reports)")
    enable_metrics: bool = Field(True, description="Expose Prometheus metrics at /metrics")
    max_batch_size: int = Field(64, ge=1, description="Embedded server: most requests decoded together in one forward pass")
    prefix_cache_tokens: int = Field(65536, ge=0, description="Embedded server: tokens of KV kept for requests that extend an earlier one, e.g. an agent's next turn (SGLang's radix cache; 0 disables it, and passes --disable-radix-cache to SGLang)")
    startup_timeout_s: float = Field(300.0, gt=0, description="Deadline for a server to become healthy")
    request_timeout_s: float = Field(120.0, gt=0, description="Deadline for one /generate request")
    max_retries: int = Field(3, ge=0, le=20, description="Retries for connection errors and 5xx answers")
    temperature: float = Field(1.0, ge=0, le=10, description="Sampling temperature for rollouts")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling threshold for rollouts")
    max_new_tokens: int = Field(128, ge=1, description="Most tokens generated per model turn")


class RolloutConfig(Section):
    concurrency: int = Field(64, ge=1, le=100_000, description="Episodes in flight at once (seed example: 256 on GPUs)")
    max_steps_per_trajectory: int = Field(8, ge=1, le=10_000, description="Turn limit per episode; hitting it records `truncated`")
    step_timeout_seconds: float = Field(60.0, gt=0, le=86_400, description="Deadline for one environment step")
    allow_partial_resume: bool = Field(True, description="Resume interrupted generations from their saved token prefix")
    resume_max_attempts: int = Field(8, ge=0, le=1000, description="Re-sends of one interrupted generation before its episode is infra_error")
    resume_deadline_s: float = Field(300.0, gt=0, description="Seconds from a generation's first failure to giving up (covers a server restart)")
    weight_sync_interval_steps: int = Field(4, ge=1, description="Trainer steps between weight syncs to the inference servers")
    max_staleness: int = Field(2, ge=0, description="Drop trajectories more than this many policy versions old")
    batch_window_ms: float = Field(10.0, ge=0, le=10_000, description="Inference batching window: requests arriving within it share a forward pass")
    mode: Literal["async", "sync"] = Field("async", description="async: rollout runs ahead of training; sync: generate a batch, then train")
    group_size: int = Field(4, ge=1, le=1024, description="GRPO group: samples per task")
    buffer_size: int = Field(256, ge=1, description="Bounded trajectory buffer between rollout and trainer")
    max_inference_queue: int = Field(512, ge=1, description="New episodes wait while the inference queue is longer than this")
    curriculum: bool = Field(False, description="Sample (family, difficulty) buckets by learnability p(1-p) of their recent success rate")
    eval_concurrency: int = Field(0, ge=0, description="Evaluation episodes in flight at once; 0 = all (fast, but greedy near-ties can flip with the batch's make-up); 1 = one at a time, so the same weights always score the same")
    seed: int = Field(1234, description="Seed for the task sampler")


class HarnessConfig(Section):
    name: str = Field(..., min_length=1, description="Registered harness name (entry point agentrl.harnesses) or module:Class")
    image_tag: str = Field("pinned-2026-08-01", description="Pinned environment image tag, recorded with every run")
    cpu: float = Field(1.0, gt=0, le=256, description="CPU cores per environment instance")
    memory_gb: float = Field(1.0, gt=0, le=4096, description="Memory per environment instance")
    network: Literal["egress_deny_by_default", "allowlist"] = Field("egress_deny_by_default", description="Sandbox egress policy")
    allowlist: list[str] = Field(default_factory=list, description="host:port pairs reachable when network is allowlist")
    weight: float = Field(1.0, ge=0, description="Share of training episodes drawn from this harness")
    held_out: bool = Field(False, description="Never trained on; evaluated to detect learning of interface conventions")
    max_concurrency: int | None = Field(None, ge=1, description="Cap on this harness's instances in flight (None = rollout.concurrency)")
    options: dict = Field(default_factory=dict, description="Harness-specific options passed to its constructor")


def _default_harnesses() -> list[HarnessConfig]:
    return [
        HarnessConfig(name="terminal_like"),
        HarnessConfig(name="code_sandbox_like"),
        HarnessConfig(name="tool_api_like", held_out=True, weight=0.0),
    ]


class SandboxConfig(Section):
    backend: Literal["bwrap", "process"] = Field("bwrap", description="bwrap = bubblewrap isolation; process = NO isolation (explicit opt-out)")
    pool_size: int = Field(8, ge=0, description="Warm sandboxes kept ready")
    max_concurrency: int = Field(64, ge=1, description="Most sandboxes alive at once")
    wall_timeout_s: float = Field(30.0, gt=0, description="Wall-clock deadline per command; the process group is killed")
    cpu_time_s: int = Field(10, ge=1, description="CPU-time limit per command (RLIMIT_CPU)")
    memory_mb: int = Field(512, ge=16, description="Memory limit per sandbox")
    max_processes: int = Field(64, ge=1, description="Process limit per sandbox")
    max_file_size_mb: int = Field(64, ge=1, description="Largest file a sandbox may write")
    max_open_files: int = Field(256, ge=16, description="Open file descriptor limit")
    tmpfs_size_mb: int = Field(64, ge=1, description="Size of the sandbox's /tmp")
    output_limit_bytes: int = Field(1_048_576, ge=1024, description="Output captured per command; the rest is dropped and flagged")
    seccomp: bool = Field(True, description="Load the seccomp filter when libseccomp is available")
    service_url: str | None = Field(None, description="Use a remote sandbox service (agentrl serve sandbox) instead of the local pool")
    bwrap: str = Field("bwrap", description="bubblewrap executable (name on PATH or a path)")
    python: str = Field("/usr/bin/python3", description="Interpreter inside the sandbox (must live under /usr, which is bound read-only)")
    workdir_size_mb: int = Field(64, ge=1, description="Size of each sandbox's work directory (a tmpfs when running as root)")
    root_dir: str = Field("/tmp/agentrl-sandboxes", description="Host directory holding the sandboxes' work directories")
    lease_timeout_s: float = Field(600.0, gt=0, description="A sandbox held longer than this is reclaimed by force")


class RewardConfig(Section):
    service_url: str | None = Field(None, description="Reward service URL; None scores in-process")
    timeout_s: float = Field(30.0, gt=0, description="Deadline for scoring one trajectory")
    max_retries: int = Field(2, ge=0, le=10, description="Retries before a trajectory is marked infra_error")
    normalization: Literal["none", "group", "window"] = Field("group", description="Reward normalisation: none, per task group, or running window")
    window_size: int = Field(256, ge=1, description="Running-window size when normalization is window")
    weights: dict[str, float] = Field(
        default_factory=lambda: {"outcome": 1.0, "format": 0.1, "tool_legality": 0.1},
        description="Weights of the named reward components")
    cache_size: int = Field(100_000, ge=0, description="Idempotency cache entries")


class TrainingConfig(Section):
    backend: Literal["deepspeed"] = Field("deepspeed", description="Training backend implementation")
    algorithm: Literal["grpo"] = Field("grpo", description="Policy optimisation algorithm")
    seq_len_limit: int = Field(2048, ge=64, description="Longest training sequence in tokens (seed example: 32768 on GPUs)")
    checkpoint_interval_steps: int = Field(10, ge=1, description="Trainer steps between checkpoints (seed example: 50)")
    resume_from_latest: bool = Field(True, description="Resume from the newest complete checkpoint when one exists")
    keep_last_checkpoints: int = Field(3, ge=1, description="Checkpoints kept; older ones are deleted")
    total_steps: int = Field(100, ge=1, description="Trainer steps in a full run")
    learning_rate: float = Field(1e-5, gt=0, lt=1, description="Optimizer learning rate")
    micro_batch_size: int = Field(4, ge=1, description="Trajectories per rank per forward pass")
    gradient_accumulation_steps: int = Field(1, ge=1, description="Micro-batches accumulated per optimizer step")
    zero_stage: int = Field(2, ge=0, le=3, description="DeepSpeed ZeRO stage")
    precision: Literal["fp32", "bf16", "fp16"] = Field("fp32", description="Training precision (fp32 on CPU)")
    world_size: int = Field(1, ge=1, description="Trainer ranks")
    dist_backend: Literal["auto", "gloo", "nccl"] = Field("auto", description="Collective backend; auto = nccl with GPUs, gloo without")
    clip_eps: float = Field(0.2, gt=0, lt=1, description="PPO clip range")
    kl_coef: float = Field(0.0, ge=0, description="KL penalty (k3) to the reference model: the starting weights, kept frozen beside the policy (0 = none loaded)")
    entropy_coef: float = Field(0.0, ge=0, description="Entropy bonus")
    loss_aggregation: Literal["token_mean", "seq_mean"] = Field(
        "token_mean", description="token_mean: every trained token weighs the same; seq_mean: every trajectory weighs the same")
    advantage_std_scale: bool = Field(True, description="Divide each GRPO group's advantages by its reward std; false = mean-centred only (Dr. GRPO), so small process-reward differences in an all-failed group stay small")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping norm")
    weight_sync: Literal["disk", "distributed"] = Field("disk", description="Weight sync transport to the inference servers")
    deepspeed_config: str | None = Field(None, description="DeepSpeed JSON to start from (default: templates/deepspeed/zero<stage>.json)")
    seed: int = Field(1234, description="Seed for model init, sampling and data order")
    watchdog_seconds: float = Field(300.0, gt=0, description="A component (server, harness, reward, train step) with work and no progress this long is flagged stuck")


class S3Config(Section):
    bucket: str = Field("agentrl", min_length=3, description="Bucket for trajectories")
    prefix: str = Field("trajectories", description="Key prefix inside the bucket")
    endpoint_url: str | None = Field(None, description="S3-compatible endpoint (None = AWS)")
    region: str = Field("us-east-1", description="Bucket region")


class DataConfig(Section):
    store: Literal["local", "s3"] = Field("local", description="Trajectory store: a local directory or S3")
    root: str = Field("data/trajectories", description="Local store directory (and spool and temp files for S3)")
    s3: S3Config = Field(default_factory=S3Config, description="S3 settings when store is s3")
    compression: Literal["zstd", "snappy", "gzip", "none"] = Field("zstd", description="Parquet compression codec")
    rows_per_file: int = Field(1024, ge=1, description="Trajectories buffered before a Parquet file is published")
    retention_days: int = Field(30, ge=1, description="Trajectories older than this are removed by `agentrl data gc`")
    redact_fields: list[str] = Field(default_factory=lambda: ["api_key", "token", "password", "secret"], description="Field names whose values are always redacted")


class ObserveConfig(Section):
    runs_dir: str = Field("runs", description="Where run directories (reports, metrics, checkpoints) are created")
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="Log level")
    prometheus_port: int | None = Field(None, ge=1, le=65535, description="Serve Prometheus metrics on this port (None = off)")
    tensorboard: bool = Field(False, description="Also write TensorBoard event files")


class PoolConfig(Section):
    name: str = Field(..., min_length=1, description="Resource pool name")
    capacity: int = Field(1, ge=1, description="Jobs the pool runs at once")
    quota: int = Field(4, ge=1, description="Jobs a pool may hold (queued plus running) before new ones are refused")


class ControlPlaneConfig(Section):
    state_store: str = Field("sqlite:///runs/state.db", description="sqlite:///PATH or postgresql://... state store URL")
    executor: Literal["local", "kubernetes"] = Field("local", description="Where jobs run")
    lease_seconds: float = Field(10.0, gt=0, description="Leader lease duration")
    pools: list[PoolConfig] = Field(
        default_factory=lambda: [PoolConfig(name="cpu", capacity=2), PoolConfig(name="gpu", capacity=1)],
        description="Resource pools jobs are queued into")


class ClusterConfig(Section):
    nodes: int = Field(1, ge=1, description="Nodes in the training cluster")
    gpus_per_node: int = Field(0, ge=0, description="GPUs per node (0 = CPU only)")
    namespace: str = Field("agentrl", description="Kubernetes namespace")
    kueue_queue: str = Field("agentrl-queue", description="Kueue LocalQueue jobs are submitted to")
    image_registry: str = Field("registry.local/agentrl", description="Registry for the role images")
    base_image: str = Field("python:3.11-slim", description="Pinned base image the role images build on")


# What the built-in tiny model needs to learn within minutes on a CPU: sync rollouts with fresh weights
# every step, groups of 8, 32 trajectories per step, a learning rate far above a large model's, a KL
# anchor to the warm start, and the learnability curriculum (see README, "Stage 8 short").
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
    inference_min_tokens_per_s: float = Field(50.0, ge=0, description="Stage 4: minimum generated tokens/s under load")
    inference_max_p99_ms: float = Field(30_000.0, gt=0, description="Stage 4: maximum p99 request latency (ms)")
    inference_load_concurrency: int = Field(32, ge=1, description="Stage 4: concurrent requests in the load test")
    logprob_max_abs_diff: float = Field(1e-3, gt=0, description="Stage 4: log-probs vs forward pass, max abs difference")
    sandbox_concurrency: int = Field(16, ge=1, description="Stage 5: sandboxes created at once")
    reward_min_scores_per_s: float = Field(20.0, ge=0, description="Stage 6: minimum reward-service throughput")
    data_min_compression_ratio: float = Field(2.0, ge=1, description="Stage 7: minimum Parquet compression ratio")
    smoke_steps: int = Field(20, ge=1, description="Stage 8 smoke: trainer steps")
    short_minutes: float = Field(15.0, gt=0, description="Stage 8 short: time budget in minutes")
    short_eval_every_steps: int = Field(20, ge=1, description="Stage 8 short: trainer steps between evaluations (the curve)")
    short_min_success_gain: float = Field(0.15, ge=0, le=1, description="Stage 8 short: required eval success-rate gain over the warm start")
    short_recipe: dict[str, Any] | None = Field(
        default_factory=lambda: dict(SHORT_RECIPE),
        description="Stage 8 short: config overrides (dotted keys) for the run, the built-in tiny model's GRPO recipe; a mapping given replaces the whole recipe, null runs the config as it is")
    baseline_max_drift: float = Field(0.5, gt=0, description="verify: largest relative deviation from the stage-0 baseline")
    cross_harness_max_drop: float = Field(0.3, ge=0, le=1, description="verify: largest held-out vs training score drop")


class PlatformConfig(Section):
    """The whole of agentrl.yaml."""

    model: ModelConfig = Field(default_factory=ModelConfig, description="Policy model")
    inference: InferenceConfig = Field(default_factory=InferenceConfig, description="Inference servers")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Asynchronous rollout")
    harnesses: list[HarnessConfig] = Field(default_factory=_default_harnesses, description="Environments (harnesses)")
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig, description="Sandbox pool")
    reward: RewardConfig = Field(default_factory=RewardConfig, description="Reward service")
    training: TrainingConfig = Field(default_factory=TrainingConfig, description="Trainer")
    data: DataConfig = Field(default_factory=DataConfig, description="Trajectory store")
    observe: ObserveConfig = Field(default_factory=ObserveConfig, description="Metrics, logs, run directories")
    controlplane: ControlPlaneConfig = Field(default_factory=ControlPlaneConfig, description="State store, queue, pools")
    cluster: ClusterConfig = Field(default_factory=ClusterConfig, description="Cluster shape (production)")
    stages: StageThresholds = Field(default_factory=StageThresholds, description="Stage check thresholds")

    @field_validator("harnesses")
    @classmethod
    def _harness_names_unique(cls, harnesses: list[HarnessConfig]) -> list[HarnessConfig]:
        names = [h.name for h in harnesses]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"harness names must be unique; repeated: {', '.join(dupes)}")
        if harnesses and all(h.held_out for h in harnesses):
            raise ValueError("at least one harness must be trained on (held_out: false)")
        return harnesses
