"""The typed platform configuration: one pydantic model per section of `agentrl.yaml`.

Every field has a one-line description and a default that works on one 2-core CPU box with the
embedded parts. The seed documents' keys keep their names (`rollout.concurrency`,
`max_steps_per_trajectory`, `harnesses[].image_tag`, `training.seq_len_limit`, ...).
Loading, merging and error formatting live in `load.py`; nothing here reads files.
"""

from __future__ import annotations

import ipaddress
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from agentrl_cli.core import parts
from agentrl_cli.core.plugins import PLUGIN_PATH

# the registered names, read from the registries' rows (agentrl_cli/core/parts.py)
BACKEND_NAMES = parts.names(parts.BACKENDS)
WEIGHT_SYNC_NAMES = parts.names(parts.TRANSPORTS)
ENGINE_NAMES = parts.names(parts.ENGINES)
REWARD_COMPONENTS = parts.names(parts.REWARD_TERMS)
VERIFIER_NAMES = parts.names(parts.VERIFIERS)


class Section(BaseModel):
    """Base for every section: unknown keys are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelConfig(Section):
    path: str = Field("builtin:tiny-agent", description="Hugging Face model directory, or builtin:tiny-agent for the built-in tiny model")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="Parameter dtype for inference and training (float32 on CPU)")
    cache_dir: str = Field("~/.cache/agentrl", description="Where the built-in model and other artefacts are cached")
    context_length: int = Field(2048, ge=64, le=1_048_576, description="Maximum tokens of prompt plus completion")


class InferenceConfig(Section):
    engine: str = Field("hf", description="hf = embedded server on this host; sglang = SGLang servers; or the `module:Class` path of an InferenceEngine of your own (docs/engines.md)",
                        json_schema_extra={"choices": ENGINE_NAMES, "plugin": "module:Class"})
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
    cpu_threads: int = Field(0, ge=0, le=1024, description="Embedded server on CPU: torch threads of each server process; 0 = auto: this host's cores split evenly between the embedded servers and the trainer ranks a run starts here (measured on 2 shared cores: one thread each beats two each by 1.5-3x)")

    @field_validator("engine")
    @classmethod
    def _engine_name(cls, value: str) -> str:
        if value not in ENGINE_NAMES and not PLUGIN_PATH.match(value):
            raise ValueError(f"must be one of {', '.join(ENGINE_NAMES)} or a `module:Class` path, got {value!r}")
        return value


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
    buffer_size: int = Field(256, ge=1, description="Bounded trajectory buffer between rollout and trainer")
    max_inference_queue: int = Field(512, ge=1, description="New episodes wait while more generation requests than this are in flight to the inference servers")
    dynamic_sampling: bool = Field(False, description="DAPO dynamic sampling: a group whose trained rewards are all equal (no GRPO signal) is dropped before its step, which takes more groups instead; a step left with none trains nothing and is counted (rollout/skipped_steps)")
    max_refill_rounds: int = Field(3, ge=0, le=100, description="Dynamic sampling: most rounds of taking (in sync mode, generating) more groups to replace a step's dropped ones; past that the step trains on the groups with signal it has")
    truncation: Literal["mask", "score", "penalize"] = Field("score", description="Episodes cut at max_steps_per_trajectory or training.seq_len_limit: mask = never trained on; score = trained on with their reward; penalize = trained on with reward -1")
    env_create_retries: int = Field(2, ge=0, le=20, description="Retries of a failed environment creation (reset) before the episode is masked as infra_error")
    env_create_backoff_s: float = Field(0.5, ge=0, le=60, description="Wait before the first retry of an environment creation; doubled each retry")
    curriculum: bool = Field(False, description="Sample (family, difficulty) buckets by learnability p(1-p) of their recent success rate")
    eval_concurrency: int = Field(0, ge=0, description="Evaluation episodes in flight at once; 0 = all (fast, but greedy near-ties can flip with the batch's make-up); 1 = one at a time, so the same weights always score the same")
    seed: int = Field(1234, description="Seed for the task sampler")


class HarnessConfig(Section):
    name: str = Field(..., min_length=1, description="Registered harness name (entry point agentrl.harnesses) or module:Class")
    image_tag: str = Field("pinned-2026-08-01", description="Pinned environment image tag, recorded with every run")
    cpu: float | None = Field(None, gt=0, le=256, description="CPU cores per environment instance: a cgroup CPU quota on each of this harness's sandboxes (None = no quota)")
    memory_gb: float | None = Field(None, gt=0, le=4096, description="Memory per environment instance: the memory limit of this harness's sandboxes (None = sandbox.memory_mb)")
    network: Literal["egress_deny_by_default", "allowlist"] = Field(
        "egress_deny_by_default", description="Sandbox egress policy: egress_deny_by_default = nothing outside the sandbox is reachable; allowlist = only the allowlist's endpoints")
    allowlist: list[str] = Field(default_factory=list, description="host:port endpoints reachable from the harness's sandboxes when network is allowlist (loopback addresses, or host names mapped inside); everything else stays unreachable")
    weight: float = Field(1.0, ge=0, description="Share of training episodes drawn from this harness")
    held_out: bool = Field(False, description="Never trained on; evaluated to detect learning of interface conventions")
    max_concurrency: int | None = Field(None, ge=1, description="Cap on this harness's instances in flight (None = rollout.concurrency)")
    options: dict = Field(default_factory=dict, description="Harness-specific options passed to its constructor")
    reward: Literal["verifiers", "harness", "mix"] | None = Field(
        None, description="Where this harness's training reward comes from: verifiers = the task's verifier (meta.verify); harness = the harness's own compute_reward; mix = the verifier's outcome plus compute_reward's score as the `harness` component, weighted by reward.weights.harness; None = the harness class's reward_source, else verifiers")
    roles: dict[str, str] = Field(default_factory=dict, description="Who plays each role of a multi-agent harness (one that declares roles): role -> policy (the policy under training; self-play when several roles are), scripted (the harness's scripted_move) or the URL of an inference server with the policy's tokenizer (a fixed opponent, never trained); a role not named is policy; refused for a harness without roles")
    tasks: str | None = Field(None, description="Tasks of this harness: a JSONL or Parquet file (local path or s3://bucket/key) with task_id, prompt, answer, split and optional difficulty, meta (None = the harness's own task_set(), else the committed task set)")

    @model_validator(mode="after")
    def _allowlist_valid(self) -> "HarnessConfig":
        if self.allowlist and self.network != "allowlist":
            raise ValueError(f"harness {self.name!r}: allowlist is set but network is {self.network!r}; "
                             "set network: allowlist for it to take effect, or remove the allowlist")
        for entry in self.allowlist:
            host, sep, port = entry.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"harness {self.name!r}: allowlist entry {entry!r} is not host:port (e.g. 127.0.0.1:8080)")
            if int(port) < 1024:
                raise ValueError(f"harness {self.name!r}: allowlist entry {entry!r}: ports below 1024 cannot be opened inside "
                                 "the sandbox (its user holds no capabilities); serve it at a port >= 1024")
            try:
                ip = ipaddress.ip_address(host.strip("[]"))
            except ValueError:
                continue  # a host name: mapped to a loopback address inside the sandbox
            if not (ip.is_loopback and ip.version == 4):
                raise ValueError(f"harness {self.name!r}: allowlist entry {entry!r}: the sandbox has no route to "
                                 "non-loopback addresses; name the host instead (it is mapped inside), or use 127.x")
        return self


def _default_harnesses() -> list[HarnessConfig]:
    return [
        HarnessConfig(name="terminal_like"),
        HarnessConfig(name="code_sandbox_like"),
        HarnessConfig(name="tool_api_like", held_out=True, weight=0.0),
    ]


class GatewayConfig(Section):
    """The recording gateway a training run starts for its agent harnesses (harnesses/agent)."""

    port: int = Field(0, ge=0, le=65535, description="Port of the run's gateway on 127.0.0.1 (0 = a free one; the agent sandboxes' allowlist gets it either way)")
    host: str = Field("127.0.0.1", description="Address `agentrl serve gateway` binds (loopback by default; the rendered gateway pod passes 0.0.0.0); a run's own gateway stays on 127.0.0.1")
    session_ttl_s: float = Field(600.0, gt=0, le=86_400, description="An agent session idle this long (no call in flight, none begun) expires; its episode ends without its record")
    retry_after_s: float = Field(1.0, gt=0, le=600, description="What a 429 (the run's staleness limit reached) asks an agent to wait before retrying (Retry-After; the openai SDK honours it)")
    api_key: SecretStr | None = Field(None, description="Bearer key(s) session management at `agentrl serve gateway` requires, one per line: the first is current, every one is accepted (rotation: `agentrl secrets rotate`); give it by AGENTRL_GATEWAY__API_KEY_FILE, never argv")


class SandboxConfig(Section):
    backend: Literal["bwrap", "process"] = Field("bwrap", description="bwrap = bubblewrap isolation; process = NO isolation (explicit opt-out)")
    host: str = Field("127.0.0.1", description="Address `agentrl serve sandbox` binds (loopback by default; the rendered sandbox pod passes 0.0.0.0)")
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
    api_key: SecretStr | None = Field(None, description="Bearer key(s) the sandbox service requires and sandbox.service_url clients send, one per line: the first is sent, every one is accepted (rotation: `agentrl secrets rotate`); give it by AGENTRL_SANDBOX__API_KEY_FILE, never argv. Without one the service refuses to start unless bound to loopback with --insecure-loopback")


class JudgeConfig(Section):
    url: str | None = Field(None, description="OpenAI-compatible base URL of the `judge` verifier's model (ending in /v1: the embedded server's, or any provider's); None = the run's own inference server (inference.urls[0], else inference.host:port), which is the policy in training")
    model: str | None = Field(None, description="Model name sent to the judge; None = the first model the judge's /v1/models lists")
    prompt_version: Literal["1"] = Field("1", description="Version of the judge's prompt (rubric, candidate layout, reply format); part of every judge cache key and of the verifier's version")
    mode: Literal["single", "group"] = Field("single", description="single = each trajectory judged alone against the rubric; group = the trajectories of one GRPO group ranked against each other in one judge call (relative judging)")
    timeout_s: float = Field(20.0, gt=0, description="Deadline of one judge HTTP call; a slower judge is an outage (infra_error, masked). It and group_wait_s must fit inside reward.timeout_s")
    group_wait_s: float = Field(5.0, ge=0, description="Group mode: how long a finished trajectory waits for the rest of its GRPO group before the part that arrived is judged")
    max_tokens: int = Field(512, ge=16, le=32768, description="Most tokens the judge may write in its reply")


class RewardConfig(Section):
    service_url: str | None = Field(None, description="Reward service URL; None scores in-process")
    host: str = Field("127.0.0.1", description="Address `agentrl serve reward` binds (loopback by default; the rendered reward pod passes 0.0.0.0)")
    timeout_s: float = Field(30.0, gt=0, description="Deadline for scoring one trajectory")
    max_retries: int = Field(2, ge=0, le=10, description="Retries before a trajectory is marked infra_error")
    normalization: Literal["none", "group", "window"] = Field("none", description="Rewards normalised before the GRPO advantages: none (GRPO's own per-group centring only), group (z-score within each task group), window (z-score against a running window of recent rewards, across steps)")
    window_size: int = Field(256, ge=1, description="Running-window size (rewards) when reward.normalization is window")
    verifiers: list[str] = Field(default_factory=list, description="Extra scorers beside the task's outcome verifier, each a reward component of its own name weighted by reward.weights[name] (no weight: recorded, no effect): judge, reward_model, or a user reward function `module:function` (docs/reward-data.md: Reward composition)")
    weights: dict[str, float] = Field(
        default_factory=lambda: {"outcome": 1.0, "format": 0.1, "tool_legality": 0.1},
        description="Weights of the named reward components: outcome, format, tool_legality, turns_in_range, invalid_action_ratio, harness, and each reward.verifiers entry; a component without a weight is recorded and has no effect")
    cache_size: int = Field(100_000, ge=0, description="Idempotency cache entries")
    api_key: SecretStr | None = Field(None, description="Bearer key(s) the reward service requires and reward.service_url clients send, one per line: the first is sent, every one is accepted (rotation: `agentrl secrets rotate`); give it by AGENTRL_REWARD__API_KEY_FILE, never argv")
    judge: JudgeConfig | None = Field(None, description="The `judge` scorer (reward.verifiers: [judge], or a task's meta.verify: judge): a model scoring trajectories against a rubric through an OpenAI-compatible API (docs/reward-data.md: Model judge); None = its defaults")
    judge_api_key: SecretStr | None = Field(None, description="Bearer key sent to reward.judge.url (None with judge.url unset: inference.api_key); give it by AGENTRL_REWARD__JUDGE_API_KEY_FILE, never argv")
    reward_model: str = Field("", validate_default=True, description="The `reward_model` scorer (reward.verifiers or a task's meta.verify: reward_model): the directory `agentrl reward train` saved, or its --name (under model.cache_dir/reward-models); required when reward.verifiers lists reward_model")

    @field_validator("verifiers")
    @classmethod
    def _verifier_names(cls, names: list[str]) -> list[str]:
        for name in names:
            if name in REWARD_COMPONENTS:
                raise ValueError(f"{name!r} is a built-in component, not a scorer; give it a weight in reward.weights instead")
            if name not in VERIFIER_NAMES and not PLUGIN_PATH.match(name):
                raise ValueError(f"must each be one of {', '.join(VERIFIER_NAMES)} or a `module:function` path, got {name!r}")
        if len(set(names)) < len(names):
            raise ValueError(f"lists a scorer twice: {names}")
        return names

    @field_validator("reward_model")
    @classmethod
    def _reward_model_named(cls, spec: str, info) -> str:
        if "reward_model" in info.data.get("verifiers", []) and not spec.strip():  # verifiers is validated first
            raise ValueError("reward.verifiers lists reward_model but reward.reward_model is empty; set it to the directory "
                             "`agentrl reward train` printed (or its --name), or remove reward_model from reward.verifiers")
        return spec

    @field_validator("weights")
    @classmethod
    def _weights_name_components(cls, weights: dict[str, float], info) -> dict[str, float]:
        known = [*REWARD_COMPONENTS, *info.data.get("verifiers", [])]  # verifiers is validated first (field order)
        unknown = sorted(set(weights) - set(known))
        if unknown:
            raise ValueError(f"names no reward component: {', '.join(unknown)}; the components are {', '.join(known)}; "
                             "fix the name, or add the scorer to reward.verifiers")
        return weights


LORA_TARGETS_DEFAULT = ["q_proj", "k_proj", "v_proj", "o_proj"]


class LoraConfig(Section):
    rank: int = Field(8, ge=1, le=1024, description="LoRA rank r of each adapted projection")
    alpha: float = Field(16.0, gt=0, le=100_000, description="LoRA alpha: the adapter's update is scaled by alpha / rank")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the adapter's input while training (0 keeps the trainer's and the server's log-probs alike)")
    target_modules: list[str] = Field(default_factory=lambda: list(LORA_TARGETS_DEFAULT), min_length=1,
                                      description="Module names (last component) that get an adapter; the default is the Llama-family attention projections (3.0% of a full sync at rank 8 on the built-in model; adding gate_proj, up_proj, down_proj makes it 7.4%)")


class TrainingConfig(Section):
    backend: str = Field("deepspeed", description="Training backend: deepspeed (ZeRO stage training.zero_stage), fsdp (PyTorch FSDP2, sharded over the ranks; reads no zero_stage), or the `module:Class` path of a TrainingBackend (agentrl_cli/learner/backend.py)")
    seq_len_limit: int = Field(2048, ge=64, description="Longest training sequence in tokens (typical on GPUs: 32768)")
    checkpoint_interval_steps: int = Field(10, ge=1, description="Trainer steps between checkpoints (typical on GPUs: 50)")
    resume_from_latest: bool = Field(True, description="Resume from the newest complete checkpoint when one exists")
    keep_last_checkpoints: int = Field(3, ge=1, description="Checkpoints kept; older ones are deleted")
    max_restarts: int = Field(2, ge=0, le=100, description="A trainer crash (a rank killed, out of memory, a train step that raised or stopped answering) restarts the run from its latest complete checkpoint up to this many times; each restart is a metrics.jsonl row with its cause; 0 = a crash ends the run")
    total_steps: int = Field(100, ge=1, description="Trainer steps in a full run")
    learning_rate: float = Field(1e-5, gt=0, lt=1, description="Optimizer learning rate")
    micro_batch_size: int = Field(4, ge=1, description="Trajectories per rank per forward pass")
    max_tokens_per_micro_batch: int = Field(0, ge=0, le=16_777_216, description="Packing: samples of a step are packed into micro-batches of at most this many tokens (no attention across samples, positions restart per sample) instead of micro_batch_size padded rows; 0 = off")
    lora: LoraConfig | None = Field(None, description="Train a LoRA adapter (peft) instead of every weight; weight sync then sends the adapter alone (None = full fine-tuning)")
    gradient_accumulation_steps: int = Field(1, ge=1, description="Micro-batches accumulated per optimizer step")
    zero_stage: int = Field(2, ge=0, le=3, description="DeepSpeed ZeRO stage")
    precision: Literal["fp32", "bf16", "fp16"] = Field("fp32", description="Training precision (fp32 on CPU)")
    world_size: int = Field(1, ge=1, description="Trainer ranks")
    dist_backend: Literal["auto", "gloo", "nccl"] = Field("auto", description="Collective backend; auto = nccl with GPUs, gloo without")
    master_port: int = Field(29500, ge=1, le=65535, description="Rendezvous port of the trainer ranks when cluster.nodes > 1: the launcher's --master_port on the first host of the hostfile, which every trainer node must reach (`agentrl plan` lists it); one node takes a free loopback port instead")
    clip_eps: float = Field(0.2, gt=0, lt=1, description="PPO clip range")
    clip_ratio_low: float | None = Field(None, gt=0, lt=1, description="Lower clip: the ratio is kept above 1 - this (None = clip_eps)")
    clip_ratio_high: float | None = Field(None, gt=0, le=10, description="Upper clip: the ratio is kept below 1 + this (None = clip_eps; DAPO's clip-higher uses 0.28)")
    ratio_level: Literal["token", "sequence"] = Field("token", description="token: PPO's per-token ratio; sequence: every token takes its sequence's exp(mean log-ratio) (GSPO)")
    correction: Literal["none", "tis", "seq_tis", "mis", "seq_mis", "decoupled"] = Field(
        "none", description="Off-policy correction (learner/corrections.py): none = clip pi_theta/pi_rollout; the others clip pi_theta/pi_old (one extra no-grad forward) times rho = pi_old/pi_rollout, tis/seq_tis truncated at is_cap, mis/seq_mis dropped outside [mis_low, mis_high], decoupled (AReaL) dropped above is_cap")
    is_cap: float = Field(2.0, ge=1, le=10_000, description="C of tis and seq_tis (weights truncated at C) and of decoupled (tokens with rho above C dropped)")
    mis_low: float = Field(0.5, ge=0, lt=1, description="mis / seq_mis: tokens (sequences) with rho = pi_old/pi_rollout below this are dropped from the loss")
    mis_high: float = Field(2.0, gt=1, le=10_000, description="mis / seq_mis: tokens (sequences) with rho above this are dropped from the loss")
    kl_coef: float = Field(0.0, ge=0, description="KL penalty (k3) to the reference model: the starting weights, kept frozen beside the policy (0 = none loaded)")
    entropy_coef: float = Field(0.0, ge=0, description="Entropy bonus")
    loss_aggregation: Literal["token_mean", "seq_mean_token_sum", "seq_mean"] = Field(
        "token_mean", description="token_mean: sum of token losses / the step's trained tokens (every token weighs the same); seq_mean_token_sum: each sequence's summed token losses, averaged over the step's sequences (DAPO and verl name it so; longer answers weigh more); seq_mean: each sequence's mean token loss, averaged over sequences (every trajectory weighs the same)")
    overlong_filter: bool = Field(False, description="DAPO overlong filtering: episodes cut at seq_len_limit (truncated with no room left) are left out of the loss; their rewards still count in their group's baseline")
    overlong_buffer_tokens: int = Field(0, ge=0, le=1_048_576, description="DAPO soft overlong penalty: an episode of L tokens loses overlong_penalty * (L - (seq_len_limit - this)) / this of its reward past seq_len_limit - this (the whole penalty at the limit); 0 = off")
    overlong_penalty: float = Field(1.0, ge=0, le=100, description="The reward taken off at seq_len_limit by the soft overlong penalty (see overlong_buffer_tokens)")
    advantage_std_scale: bool = Field(True, description="Divide each GRPO group's advantages by its reward std; false = mean-centred only (Dr. GRPO), so small process-reward differences in an all-failed group stay small")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping norm")
    weight_sync: str = Field("disk", description="Weight sync transport to the inference servers: disk, distributed, or the `module:Class` path of a WeightTransport (agentrl_cli/weightsync/base.py)")
    deepspeed_config: str | None = Field(None, description="DeepSpeed JSON to start from (default: templates/deepspeed/zero<stage>.json)")
    seed: int = Field(1234, description="Seed for model init, sampling and data order")
    watchdog_seconds: float = Field(300.0, gt=0, description="A component (server, harness, reward, train step) with work and no progress this long is flagged stuck")
    start_timeout_s: float = Field(600.0, gt=0, le=86_400, description="Deadline for the trainer ranks (training.world_size > 1) to start: the launcher's rendezvous, DeepSpeed's set-up and the model load, until rank 0 answers; past it the ranks are stopped, naming the one missing")
    rank_timeout_s: float = Field(1800.0, gt=0, le=86_400, description="Deadline for one call to the trainer ranks (training.world_size > 1): a train step, a checkpoint save or load, a weight export; past it the ranks are stopped as hung and the run restarts from its latest checkpoint (training.max_restarts)")
    checkpoint_timeout_s: float = Field(1800.0, gt=0, le=86_400, description="Deadline for writing one checkpoint (the trainer's state, the run's state and the ledger of trained draws); past it the run stops with CheckpointTimeout instead of waiting on storage that does not answer")
    step_wait_timeout_s: float = Field(600.0, gt=0, le=86_400, description="Deadline for the trainer's wait for one step's groups off the rollout buffer (in sync mode after generating them; again for each refill round of rollout.dynamic_sampling); at it the step trains the complete groups there are, and with none the run stops (the rollout produced no complete group in time). The default 600 s is what this wait was before it had a key of its own: 10 x rollout.step_timeout_seconds at that key's default 60 s; rollout.step_timeout_seconds no longer sets it")
    weight_sync_timeout_s: float = Field(120.0, gt=0, le=86_400, description="Deadline for each wait of a distributed weight sync (training.weight_sync: distributed): every server joining the group (init_weights_update_group) and each broadcast; past it the sync fails naming the servers, and is retried once they answer")
    cpu_threads: int = Field(0, ge=0, le=1024, description="Trainer on CPU: torch threads of each rank; 0 = auto: this host's cores split evenly between the trainer ranks and the embedded inference servers the run starts here")

    @field_validator("backend", "weight_sync")
    @classmethod
    def _plugin_name(cls, value: str, info) -> str:
        known = {"backend": BACKEND_NAMES, "weight_sync": WEIGHT_SYNC_NAMES}[info.field_name]
        if value not in known and not PLUGIN_PATH.match(value):
            raise ValueError(f"must be one of {', '.join(known)} or a `module:Class` path, got {value!r}")
        return value

    @model_validator(mode="after")
    def _overlong_buffer_fits(self) -> "TrainingConfig":
        if self.overlong_buffer_tokens >= self.seq_len_limit:
            raise ValueError(f"overlong_buffer_tokens ({self.overlong_buffer_tokens}) must be below seq_len_limit "
                             f"({self.seq_len_limit}); lower it (DAPO uses a fifth of the limit) or set 0 to turn the penalty off")
        return self


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
    write_timeout_s: float = Field(300.0, gt=0, le=86_400, description="Deadline for publishing the buffered trajectories to the store (a flush; with S3 its retries included, after which a file is spooled locally); past it the write fails with StoreTimeout instead of hanging")
    retention_days: int = Field(30, ge=1, description="Trajectories older than this are removed by `agentrl data gc`")
    redact_fields: list[str] = Field(default_factory=lambda: ["api_key", "token", "password", "secret"], description="Field names whose values are always redacted")
    max_tool_output_bytes: int = Field(16384, ge=0, le=16 * 1024 * 1024, description="Each tool call's output is stored (in its trajectory step and in the run's call log, `agentrl data calls`) clipped to this many bytes of UTF-8, with the whole output's size and sha256; the output is what the harness reported for the call (the sandboxed harnesses clip it to what the agent was shown)")


class ObserveConfig(Section):
    runs_dir: str = Field("runs", description="Where run directories (reports, metrics, checkpoints) are created")
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="Level of agentrl's own loggers (and uvicorn's) in every process a run starts: this one, its inference servers (SGLang's --log-level), its trainer ranks and services; other libraries log warnings and above (at error, errors only)")
    log_max_mb: float = Field(100.0, gt=0, le=1_000_000, description="A log file of a run (<run dir>/…/logs/: agentrl.log, each server's and the trainer ranks' output) is rotated when it passes this size (MB)")
    log_backups: int = Field(3, ge=0, le=1000, description="Rotated files kept per log (NAME.log.1 is the newest); a log then takes at most log_max_mb × (1 + log_backups) MB, the oldest dropped first")
    prometheus_port: int | None = Field(None, ge=1, le=65535, description="Serve a live run's metrics for Prometheus on this port (None = off)")
    prometheus_addr: str = Field("127.0.0.1", description="Address the Prometheus endpoint binds (0.0.0.0 lets a Prometheus server on another host scrape it)")
    tensorboard: bool = Field(False, description="Also write TensorBoard event files (<run dir>/…/tensorboard/); the same as listing tensorboard in observe.trackers")
    trackers: list[Literal["tensorboard", "wandb", "mlflow"]] = Field(default_factory=list, description="Where else every row of metrics.jsonl goes, with the same metric names and steps, plus the resolved config (secrets masked) and the run's metadata: tensorboard (event files beside metrics.jsonl), wandb (offline files under <run dir>/wandb/ unless WANDB_MODE says otherwise; `wandb sync` uploads them), mlflow (the store observe.mlflow_uri names); needs pip install 'agentrl-cli[trackers]'")
    tracker_project: str = Field("agentrl", min_length=1, description="W&B project and MLflow experiment the runs are logged under (observe.trackers)")
    mlflow_uri: str = Field("", description="MLflow tracking URI (observe.trackers: mlflow): sqlite:///PATH, postgresql://..., http://HOST:PORT of an MLflow server; empty for sqlite:///<observe.runs_dir>/mlflow.db, one store for every run (`mlflow ui --backend-store-uri` it)")
    traces: str = Field("", description="OpenTelemetry spans (OTLP JSON, one ExportTraceServiceRequest per line) appended to this file (relative to the working directory, like observe.runs_dir): one trace per episode (model calls, tool calls and the reward as children; the trajectory id an attribute) and one per train step; empty = off")
    audit_log: str = Field("", description="Where services append audit lines (JSON: time, key id, endpoint, outcome) for sandbox executions, control-plane writes, weight updates and refused requests: a file, - for stderr (a pod's log), empty for <observe.runs_dir>/audit.jsonl")
    health_interval_s: float = Field(2.0, ge=0, le=3600, description="Seconds between the run's health checks of its inference servers, gateway, reward and sandbox services (the supervisor: restarts what the run started, takes what is down out of rotation); 0 = no supervisor")
    # alert thresholds: `agentrl observe alerts` renders them as Prometheus rules and `agentrl troubleshoot --run`
    # applies the same rules to metrics.jsonl (agentrl_cli/acceptance/alerts.py)
    alert_window_minutes: float = Field(15.0, gt=0, le=10_080, description="The window every alert rule looks back over (Prometheus range [Nm]; the last N minutes of a run's rows in troubleshoot --run)")
    alert_create_failures: int = Field(5, ge=0, le=1_000_000, description="Alert when a harness's environment creations fail more than this many times within the window")
    alert_peak_memory_mb: float = Field(2048.0, gt=0, le=10_000_000, description="Alert when an episode's sandbox peaks above this much memory (MiB) within the window")
    alert_memory_creep_mb_per_hour: float = Field(512.0, gt=0, le=10_000_000, description="Alert when the sandboxes' per-episode peak memory rises faster than this (MiB per hour, linear fit over the window)")
    alert_sampling_share: float = Field(0.7, gt=0, le=1, description="Alert when the trainer spends more than this share of its steps waiting for rollouts (mean over the window)")
    alert_sync_share: float = Field(0.3, gt=0, le=1, description="Alert when weight sync takes more than this share of the trainer's steps (mean over the window)")


class SupervisorConfig(Section):
    max_restarts: int = Field(3, ge=0, le=1000, description="Restarts of one component the run started (an inference server, the gateway) before the run stops, naming it, its last log lines and the fix; 0 = the first failure stops the run")
    backoff_s: float = Field(1.0, ge=0, le=600, description="Wait before a component's first restart; it doubles with each further restart of it (at most 60 s)")


POOL_NAME = r"^[a-z]([a-z0-9-]{0,30}[a-z0-9])?$"


class PoolConfig(Section):
    """A resource pool: a Slurm partition, a Kueue ResourceFlavor with its ClusterQueue, or a slot count on this box."""

    name: str = Field(..., pattern=POOL_NAME, description="Pool name (lower case, digits, '-'): the Slurm partition, and part of the Kueue object names")
    capacity: int = Field(1, ge=1, description="CPUs the pool offers jobs at once (local: slots; Slurm: the partition's MaxCPUsPerNode; Kueue: cpu nominalQuota)")
    quota: int = Field(2, ge=1, description="Jobs of this pool that may run at once; more wait with a reason (local: Quota; Slurm: the <pool>_jobs license; Kueue: pods nominalQuota)")
    priority: int = Field(1, ge=0, le=65533, description="Pool priority tier: a higher tier goes first and requeues jobs of preemptible lower tiers (Slurm PriorityTier; local: dispatch order)")
    preemptible: bool = Field(False, description="Jobs here may be requeued for a higher tier's job (Slurm PreemptMode=REQUEUE; Kueue ClusterQueue preemption of lower priorities)")
    node_labels: dict[str, str] = Field(default_factory=dict, description="Kubernetes node labels of this pool's nodes (the Job's nodeSelector and the ResourceFlavor's nodeLabels)")
    accelerators: int = Field(0, ge=0, description="Accelerators each job of this pool asks for (Kubernetes resource cluster.accelerator_resource, with node affinity on cluster.accelerator_product)")


class PriorityConfig(Section):
    name: str = Field(..., pattern=POOL_NAME, description="Priority class name, as `agentrl job submit --priority NAME` takes it")
    value: int = Field(..., ge=0, le=1_000_000, description="Higher runs first (local queue order; Slurm job priority; Kueue WorkloadPriorityClass value)")


class ControlPlaneConfig(Section):
    state_store: str = Field("sqlite:///runs/state.db", description="sqlite:///PATH or postgresql://USER@HOST:PORT/DB state store URL (a password comes from PGPASSWORD, the file AGENTRL_PGPASSWORD_FILE names, or ~/.pgpass, never this file)")
    executor: Literal["local", "slurm", "kubernetes"] = Field("local", description="Where jobs run: local subprocesses, Slurm (sbatch), or Kubernetes Jobs queued by Kueue")
    lease_seconds: float = Field(5.0, gt=0, le=3600, description="Leader lease: a leader that has not renewed for this long is replaced by a follower")
    host: str = Field("127.0.0.1", description="Address the health endpoint of `agentrl controlplane serve` binds (loopback by default; the rendered pods pass 0.0.0.0)")
    port: int = Field(0, ge=0, le=65535, description="Port of the health endpoint of `agentrl controlplane serve` (GET /health: 200 while the instance's lease loop runs; 0 = none, as when several instances share one host); the rendered Deployment serves it on 8740")
    api_key: SecretStr | None = Field(None, description="Bearer key(s) the control plane's HTTP API requires for everything but /health (job submission, cancellation, reads), one per line: the first is current, every one is accepted (rotation: `agentrl secrets rotate`); give it by AGENTRL_CONTROLPLANE__API_KEY_FILE, never argv")
    jobs_dir: str = Field("runs/jobs", description="Job logs and the local executor's spool (on Slurm, a directory the compute nodes share)")
    pools: list[PoolConfig] = Field(
        default_factory=lambda: [PoolConfig(name="rollout", capacity=2, quota=2, priority=1, preemptible=True),
                                 PoolConfig(name="train", capacity=2, quota=1, priority=10)],
        description="Resource pools jobs are queued into")
    priorities: list[PriorityConfig] = Field(
        default_factory=lambda: [PriorityConfig(name="low", value=100), PriorityConfig(name="high", value=1000)],
        description="Job priority classes; a job without --priority gets the lowest")

    @field_validator("pools", "priorities")
    @classmethod
    def _names_unique(cls, items: list) -> list:
        names = [i.name for i in items]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"names must be unique; repeated: {', '.join(dupes)}")
        if not items:
            raise ValueError("at least one is needed")
        return items


class ClusterConfig(Section):
    nodes: int = Field(1, ge=1, description="Nodes in the training cluster (trainer replicas of the rendered JobSet)")
    gpus_per_node: int = Field(0, ge=0, description="GPUs per node (0 = CPU only); the trainer asks for this many")
    namespace: str = Field("agentrl", description="Kubernetes namespace")
    kueue_queue: str = Field("agentrl", description="Prefix of the Kueue LocalQueues, one per pool (<prefix>-<pool>)")
    image_registry: str = Field("registry.local/agentrl", description="Registry for the role images")
    base_image: str = Field("python:3.11-slim", description="Pinned base image the role images build on")
    accelerator_resource: str = Field("nvidia.com/gpu", description="Kubernetes extended resource name of an accelerator")
    accelerator_product: str = Field("", description="Node label value of nvidia.com/gpu.product that accelerator jobs require ('' = any)")
    kubeconfig: str = Field("", description="Cluster to apply to: a kubeconfig path, or in-cluster ('' = none configured: render and validate only)")
    runs_volume_claim: str = Field("agentrl-runs", pattern=r"^([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)?$", description="PersistentVolumeClaim (ReadWriteMany) `agentrl controlplane render` creates in cluster.namespace and mounts writable at observe.runs_dir in the training JobSet's trainer and inference pods, so they share the weight exports, checkpoints and rank files ('' = an emptyDir per pod: nothing shared, nothing kept past the pod; `agentrl plan --executor kubernetes` warns when a path must be shared)")
    runs_volume_gb: int = Field(0, ge=0, description="Size of cluster.runs_volume_claim in GB (0 = from `agentrl plan`: (training.keep_last_checkpoints + 1) x its checkpoint size + 3 weight exports + 1 GB, rounded up)")
    storage_class: str = Field("", description="StorageClass of cluster.runs_volume_claim; it must offer ReadWriteMany, e.g. NFS, CephFS or a cloud file store ('' = the cluster's default)")


# permissive licences, MPL-2.0 (file-level copyleft) and LGPL (libraries used unmodified, loaded dynamically)
LICENCES = ["Apache-2.0", "MIT", "MIT-0", "MIT-CMU", "BSD", "BSD-2-Clause", "BSD-3-Clause", "0BSD", "ISC", "PSF-2.0",
            "Python-2.0", "HPND", "MPL-2.0", "Zlib", "CC0-1.0", "BSL-1.0", "CNRI-Python", "Unlicense", "AFL",
            "LGPL-2.1-only", "LGPL-2.1-or-later", "LGPL-3.0-only", "LGPL-3.0-or-later"]


class ImageConfig(Section):
    lock_file: str = Field("agentrl.lock.json", description="Lock of exact versions per role: written by `agentrl image lock`, compared with the running environment by `image verify` and stage 2")
    roles: dict[str, list[str]] = Field(
        default_factory=lambda: {"base": ["torch"], "train": ["agentrl-cli", "deepspeed", "transformers", "safetensors"],
                                 "inference": ["agentrl-cli", "transformers", "safetensors"], "env": ["agentrl-cli", "pyseccomp"],
                                 "controlplane": ["agentrl-cli", "psycopg"]},
        description="Packages each image role is built from (their dependencies are locked too); base is under every role; the inference role adds sglang and sglang-router when inference.engine is sglang. The rendered manifests run train (trainer), inference (inference, gateway), env (sandbox, reward) and controlplane")
    allowed_licences: list[str] = Field(default_factory=lambda: list(LICENCES), description="Licences (SPDX ids; * wildcards) a locked package may carry; any other is a failing check naming the package")
    licence_overrides: dict[str, str] = Field(default_factory=dict, description="package -> licence, for packages whose metadata states none (set after reading their terms)")
    builder: Literal["auto", "docker", "podman", "buildah"] = Field("auto", description="Image builder for `image build` and stage 2; auto = the first of docker, podman, buildah that works here")

    @field_validator("roles")
    @classmethod
    def _base_role(cls, roles: dict[str, list[str]]) -> dict[str, list[str]]:
        if "base" not in roles:
            raise ValueError("image.roles must have a base role (the packages under every role image)")
        return roles


# What the built-in tiny model needs to learn within minutes on a CPU: sync rollouts with fresh weights
# every step, groups of 8, 32 trajectories per step, a learning rate far above a large model's, a KL
# anchor to the warm start, and the learnability curriculum (see docs/training.md, "Stage 8 short").
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
    short_eval_every_steps: int = Field(20, ge=1, description="Stage 8 short and verify's own run: trainer steps between evaluations (the curve)")
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


class PlatformConfig(Section):
    """The whole of agentrl.yaml."""

    model: ModelConfig = Field(default_factory=ModelConfig, description="Policy model")
    inference: InferenceConfig = Field(default_factory=InferenceConfig, description="Inference servers")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Asynchronous rollout")
    harnesses: list[HarnessConfig] = Field(default_factory=_default_harnesses, description="Environments (harnesses)")
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig, description="Sandbox pool")
    gateway: GatewayConfig = Field(default_factory=GatewayConfig, description="Recording gateway for agents written with an OpenAI client (the `agent` harness)")
    reward: RewardConfig = Field(default_factory=RewardConfig, description="Reward service")
    training: TrainingConfig = Field(default_factory=TrainingConfig, description="Trainer")
    data: DataConfig = Field(default_factory=DataConfig, description="Trajectory store")
    observe: ObserveConfig = Field(default_factory=ObserveConfig, description="Metrics, logs, run directories")
    supervisor: SupervisorConfig = Field(default_factory=SupervisorConfig, description="The run's supervisor: restarts of the components it started (observe.health_interval_s sets how often it checks)")
    controlplane: ControlPlaneConfig = Field(default_factory=ControlPlaneConfig, description="State store, queue, pools")
    cluster: ClusterConfig = Field(default_factory=ClusterConfig, description="Cluster shape (production)")
    image: ImageConfig = Field(default_factory=ImageConfig, description="Image lock, role images and licences")
    stages: StageThresholds = Field(default_factory=StageThresholds, description="Stage check thresholds")
    verify: VerifyConfig = Field(default_factory=VerifyConfig, description="agentrl verify thresholds and budget")

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

    @model_validator(mode="after")
    def _mix_has_a_weight(self) -> "PlatformConfig":
        mixed = [h.name for h in self.harnesses if h.reward == "mix"]
        if mixed and not self.reward.weights.get("harness"):
            raise ValueError(f"harnesses {', '.join(mixed)} use reward: mix, but reward.weights has no `harness` weight; "
                             "set reward.weights.harness (e.g. 0.5) so the harness's score counts, or use reward: harness")
        return self
