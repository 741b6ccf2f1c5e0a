"""The typed platform configuration: `PlatformConfig`, joining one pydantic model per section of
`agentrl.yaml` (each in `sections/`, re-exported here).

Every field has a one-line description and a default that works on one 2-core CPU box with the
embedded parts. The seed documents' keys keep their names (`rollout.concurrency`,
`max_steps_per_trajectory`, `harnesses[].image_tag`, `training.seq_len_limit`, ...).
Loading, merging and error formatting live in `load.py`; nothing here reads files.
"""

from __future__ import annotations


from pydantic import Field, field_validator, model_validator

from agentrl_cli.config.sections.base import (BACKEND_NAMES, ENGINE_NAMES, REWARD_COMPONENTS, VERIFIER_NAMES,  # noqa: F401
                                              WEIGHT_SYNC_NAMES, Section)
from agentrl_cli.config.sections.model import ModelConfig  # noqa: F401
from agentrl_cli.config.sections.inference import InferenceConfig  # noqa: F401
from agentrl_cli.config.sections.rollout import RolloutConfig  # noqa: F401
from agentrl_cli.config.sections.harnesses import HarnessConfig, _default_harnesses  # noqa: F401
from agentrl_cli.config.sections.gateway import GatewayConfig  # noqa: F401
from agentrl_cli.config.sections.sandbox import SandboxConfig  # noqa: F401
from agentrl_cli.config.sections.reward import JudgeConfig, RewardConfig  # noqa: F401
from agentrl_cli.config.sections.training import LORA_TARGETS_DEFAULT, LoraConfig, TrainingConfig  # noqa: F401
from agentrl_cli.config.sections.data import DataConfig, S3Config  # noqa: F401
from agentrl_cli.config.sections.observe import ObserveConfig  # noqa: F401
from agentrl_cli.config.sections.supervisor import SupervisorConfig  # noqa: F401
from agentrl_cli.config.sections.controlplane import ControlPlaneConfig, POOL_NAME, PoolConfig, PriorityConfig  # noqa: F401
from agentrl_cli.config.sections.cluster import ClusterConfig  # noqa: F401
from agentrl_cli.config.sections.image import ImageConfig, LICENCES  # noqa: F401
from agentrl_cli.config.sections.verify import SHORT_RECIPE, StageThresholds, VerifyConfig  # noqa: F401


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
    def _buffer_fits_its_budget(self) -> "PlatformConfig":
        from agentrl_cli.config.buffer_budget import buffer_limit, too_small

        r = self.rollout
        why = too_small(buffer_limit(r.max_buffer_mb, r.buffer_size, self.model.context_length))
        if why:
            raise ValueError(why)
        return self

    @model_validator(mode="after")
    def _normalization_takes_effect(self) -> "PlatformConfig":
        if self.reward.normalization != "none" and self.training.advantage_std_scale:
            raise ValueError(f"reward.normalization: {self.reward.normalization} has no effect with training.advantage_std_scale: "
                             "true: GRPO's per-group z-score of the advantages undoes any per-group or batch-wide scaling of "
                             "the rewards; set training.advantage_std_scale=false (mean-centred advantages) to use it, or "
                             "reward.normalization=none")
        return self

    @model_validator(mode="after")
    def _mix_has_a_weight(self) -> "PlatformConfig":
        mixed = [h.name for h in self.harnesses if h.reward == "mix"]
        if mixed and not self.reward.weights.get("harness"):
            raise ValueError(f"harnesses {', '.join(mixed)} use reward: mix, but reward.weights has no `harness` weight; "
                             "set reward.weights.harness (e.g. 0.5) so the harness's score counts, or use reward: harness")
        return self
