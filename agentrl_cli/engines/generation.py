"""What a generation asks for and what comes back, whatever the engine: `SamplingParams` in,
`Generation` (token ids, their log-probs, finish reason, weight version) out. An engine maps them
to and from its wire format (`InferenceEngine.generate_body` / `parse_generation`; SGLang's in
`sglang_dialect.py`). Belongs here: these two records only."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None  # per-request sampling seed (SGLang's sampling_seed)
    ignore_eos: bool = False


@dataclass
class Generation:
    output_ids: list[int]
    output_logprobs: list[float]
    finish_reason: str  # "stop" | "length" | "abort"
    weight_version: str
    latency: float
    text: str = ""
    prompt_tokens: int = 0
    server: str = ""
    retries: int = 0
    meta: dict = field(default_factory=dict)

    @property
    def aborted(self) -> bool:
        return self.finish_reason == "abort"
