"""`training`: the learner - backend, loss, corrections, LoRA, checkpoints, deadlines. One module per section; `agentrl_cli/config/models.py` joins them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from agentrl_cli.config.sections.base import (BACKEND_NAMES, WEIGHT_SYNC_NAMES, Section)
from agentrl_cli.core.plugins import PLUGIN_PATH


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
        "none", description="Off-policy correction (learner/corrections.py): none = clip pi_theta/pi_rollout; the others clip pi_theta/pi_old (pi_old: the training forward's own detached log-probs, or one extra no-grad forward where the model has dropout) times rho = pi_old/pi_rollout, tis/seq_tis truncated at is_cap, mis/seq_mis dropped outside [mis_low, mis_high], decoupled (AReaL) dropped above is_cap")
    is_cap: float = Field(2.0, ge=1, le=10_000, description="C of tis and seq_tis (weights truncated at C) and of decoupled (tokens with rho above C dropped)")
    mis_low: float = Field(0.5, ge=0, lt=1, description="mis / seq_mis: tokens (sequences) with rho = pi_old/pi_rollout below this are dropped from the loss")
    mis_high: float = Field(2.0, gt=1, le=10_000, description="mis / seq_mis: tokens (sequences) with rho above this are dropped from the loss")
    kl_coef: float = Field(0.0, ge=0, description="KL penalty (k3) to the reference model: the starting weights, kept frozen beside the policy (0 = none loaded)")
    entropy_coef: float = Field(0.0, ge=0, description="Entropy bonus: the loss subtracts this times the mean token entropy (at the sampling temperature); with entropy_target set, the bonus the run starts from")
    entropy_target: float | None = Field(None, gt=0, le=20, description="Adaptive entropy control (Skywork-OR1's): a mean token entropy (nats, at the sampling temperature) to hold the policy at. After each step the entropy bonus rises by entropy_coef_step while the step's entropy was below this and falls by it (not below 0) while above, so it pushes only when entropy runs low; reported as train/entropy_coef and kept in checkpoints. None = the fixed entropy_coef")
    entropy_coef_step: float = Field(0.002, gt=0, le=1, description="entropy_target: how much the entropy bonus moves after each step (refused without entropy_target)")
    entropy_coef_max: float = Field(0.1, gt=0, le=10, description="entropy_target: the most the adaptive entropy bonus may reach (refused without entropy_target)")
    loss_aggregation: Literal["token_mean", "seq_mean_token_sum", "seq_mean"] = Field(
        "token_mean", description="token_mean: sum of token losses / the step's trained tokens (every token weighs the same); seq_mean_token_sum: each sequence's summed token losses, averaged over the step's sequences (DAPO and verl name it so; longer answers weigh more); seq_mean: each sequence's mean token loss, averaged over sequences (every trajectory weighs the same)")
    overlong_filter: bool = Field(False, description="DAPO overlong filtering: episodes cut at seq_len_limit (truncated with no room left) are left out of the loss; their rewards still count in their group's baseline")
    overlong_buffer_tokens: int = Field(0, ge=0, le=1_048_576, description="DAPO soft overlong penalty: an episode of L tokens loses overlong_penalty * (L - (seq_len_limit - this)) / this of its reward past seq_len_limit - this (the whole penalty at the limit); 0 = off")
    overlong_penalty: float = Field(1.0, ge=0, le=100, description="The reward taken off at seq_len_limit by the soft overlong penalty (see overlong_buffer_tokens)")
    advantage_std_scale: bool = Field(True, description="Divide each GRPO group's advantages by its reward std; false = mean-centred only (Dr. GRPO), so small process-reward differences in an all-failed group stay small")
    advantage: Literal["episode", "turn"] = Field("episode", description="episode: every token of an episode trains on its episode's GRPO advantage; turn: each model turn's tokens on their turn's advantage, the episode's outcome advantage plus the turn's step-reward return baselined within the group per turn index (learner/turn_credit.py); needs harnesses that report step rewards (class attribute step_rewards), refused at load otherwise")
    turn_discount: float = Field(0.0, ge=0, le=1, description="advantage: turn: the discount gamma of the step-reward return; 0 = a step reward credits its own turn alone, > 0 = later step rewards pass back to earlier turns as gamma^(k - t) r_k")
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

    @model_validator(mode="after")
    def _entropy_control_knobs_need_a_target(self) -> "TrainingConfig":
        fields = type(self).model_fields
        given = {k for k in ("entropy_coef_step", "entropy_coef_max") if getattr(self, k) != fields[k].default}
        if self.entropy_target is None and given:
            raise ValueError(f"{', '.join(sorted(given))} set away from their defaults only take effect with entropy_target (adaptive entropy control); "
                             "set training.entropy_target to the mean token entropy to hold, or drop them")
        if self.entropy_target is not None and self.entropy_coef > self.entropy_coef_max:
            raise ValueError(f"entropy_coef ({self.entropy_coef:g}) is where the adaptive bonus starts and must not exceed "
                             f"entropy_coef_max ({self.entropy_coef_max:g}); lower it or raise entropy_coef_max")
        return self
