"""The reward service's wire types: what a scoring request carries and what a result says.

A request holds everything a verifier needs, so a trajectory can be scored anywhere (in-process or
by the HTTP service) and scored again later: the task, the steps, and the evidence the harness
collected before its sandbox was gone (final answer, files, protected hashes). Malformed input
fails validation naming the field; it never reaches a verifier and never gets a score.
"""

from __future__ import annotations

import base64
from typing import Any, Literal

import binascii

from pydantic import BaseModel, ConfigDict, Field, field_validator
from agentrl_cli.core.outcomes import RewardStatus, Termination, values

TERMINATIONS = values(Termination)[:4]  # an episode that reached the scorer; infra_error ones never do
STATUSES = values(RewardStatus)[:4]  # unscored is a stored row's state, never a result


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class TaskIn(_Strict):
    task_id: str = Field(min_length=1)
    harness: str = Field(min_length=1)
    prompt: str
    answer: Any = None
    difficulty: int = Field(1, ge=0)
    split: str = "train"
    meta: dict = Field(default_factory=dict)


class ToolCallIn(_Strict):
    name: str
    status: str = "ok"


class StepIn(_Strict):
    action: str
    observation: str = ""
    status: Literal["ok", "empty", "error", "timeout", "rate_limited", "invalid_action"] = "ok"
    tool_calls: list[ToolCallIn] = Field(default_factory=list)


class FileIn(_Strict):
    path: str = Field(min_length=1)
    content_b64: str | None = None  # None: the file was missing at the end of the episode

    @field_validator("content_b64")
    @classmethod
    def _base64(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                base64.b64decode(v, validate=True)
            except (binascii.Error, ValueError) as exc:
                raise ValueError(f"not valid base64 ({exc})") from None
        return v

    def data(self) -> bytes | None:
        return None if self.content_b64 is None else base64.b64decode(self.content_b64, validate=True)


class ScoreRequest(_Strict):
    task: TaskIn
    trajectory_id: str = Field(min_length=1)
    steps: list[StepIn]
    termination: Literal["done", "truncated", "timeout", "error"] = "done"
    final_answer: str | None = None
    files: list[FileIn] = Field(default_factory=list)
    protected: dict[str, str] = Field(default_factory=dict)  # path -> sha256 the file must still have
    idempotency_key: str | None = None  # optional; when given it must equal the content hash
    # where the outcome comes from (harnesses[].reward): the task's verifier, the harness's own
    # compute_reward (sent as harness_score, with its flags), or the verifier plus a `harness` component
    reward_source: Literal["verifiers", "harness", "mix"] = "verifiers"
    harness_score: float | None = None
    harness_flags: list[str] = Field(default_factory=list)
    harness_detail: str = ""

    def file_map(self) -> dict[str, bytes | None]:
        return {f.path: f.data() for f in self.files}


class RewardResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    trajectory_id: str
    reward: float
    components: dict[str, float]
    status: Literal["ok", "fail", "timeout", "infra_error"]
    outcome: Literal["success", "partial", "fail", "truncated", "timeout", "error"]
    verifier: str
    verifier_versions: dict[str, str]
    flags: list[str] = Field(default_factory=list)
    detail: str = ""
    attempts: int = 1
    idempotency_key: str = ""
    cached: bool = False

    @property
    def masked(self) -> bool:
        """True when the trainer must leave this trajectory out (the score says nothing about the policy)."""
        return self.status == RewardStatus.INFRA_ERROR


class BatchRequest(_Strict):
    items: list[ScoreRequest] = Field(min_length=1, max_length=10_000)


class BatchResult(BaseModel):
    results: list[RewardResult]
