"""`reward`: verifiers, weights, the model judge and the reward service. One module per section; `agentrl_cli/config/models.py` joins them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, field_validator

from agentrl_cli.config.sections.base import (REWARD_COMPONENTS, VERIFIER_NAMES,
                                              Section)
from agentrl_cli.core.plugins import PLUGIN_PATH


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
    normalization: Literal["none", "group", "window"] = Field("none", description="Rewards normalised before the GRPO advantages: none (the advantages are GRPO's own), group (z-score within each task group: every group's advantages on a unit scale), window (z-score against a running window of recent rewards, across steps: one scale for every group, set by the recent spread). group and window need training.advantage_std_scale: false (with it, GRPO's per-group z-score undoes them; refused at load)")
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
