"""The `reward_model` verifier: a scorer trained by `agentrl reward train` (`rm_train.py`) on stored
trajectories, served as a process reward beside the rules (`reward.verifiers: [reward_model]`, its
score the `reward_model` component, weighted by `reward.weights.reward_model`).

A reward-model directory holds a reference to its base (a Hugging Face causal LM directory, never
copied: its path and the sha256 of its weight files), `head.safetensors` (a value head: a linear
layer on the base's last hidden state at the final token, with the feature mean and spread it was
trained on) and `reward_model.json` (the record: base, calibration, rendering, metrics, source runs).
The base stays frozen: training fits the head only.

One rendering for training and serving (`render`): the harness, the task prompt, each step's action,
observation and status, and the final answer, as plain text ending in a fixed `verdict:` line whose
last token's hidden state the head reads; the text keeps its last `max_tokens` tokens. The score is
the head's logit through the Platt calibration fitted at training: p(success) in [0, 1].

Errors: a missing or unreadable directory, or a base whose weights changed since training, is a
ConfigError at load (exit 2, with the fix); a forward pass that fails raises `VerifierError`
(the scorer retries, then masks it as infra_error). The version is a hash of the head's weights, the
calibration, the base's weights and the rendering, so the scorer's cache keys change with any of them.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from dataclasses import dataclass
from pathlib import Path

from agentrl_cli.core.errors import ConfigError
from agentrl_cli.runtime.reward.models import ScoreRequest
from agentrl_cli.runtime.reward.verifiers import Verdict, VerifierError

RECORD = "reward_model.json"
HEAD = "head.safetensors"
FORMAT_VERSION = 1
RENDER_VERSION = "1"
DEFAULT_MAX_TOKENS = 1024
SUBDIR = "reward-models"  # under model.cache_dir: where a --name lives


def render(harness: str, prompt: str, steps: list[tuple[str, str, str]], final_answer: str | None) -> str:
    """The text the head scores: `steps` as (action, observation, status)."""
    parts = [f"harness: {harness}", f"task: {prompt}"]
    for i, (action, observation, status) in enumerate(steps, 1):
        parts += [f"[action {i}]", action, f"[observation {i}: {status}]", observation]
    parts += [f"final answer: {'(none)' if final_answer is None else final_answer}", "verdict:"]
    return "\n".join(parts)


def render_request(req: ScoreRequest) -> str:
    return render(req.task.harness, req.task.prompt, [(s.action, s.observation, s.status) for s in req.steps],
                  req.final_answer)


def weights_digest(model_dir: Path) -> str:
    """sha256 over the model directory's weight files (name and bytes, in name order)."""
    h = hashlib.sha256()
    files = sorted(p for p in Path(model_dir).iterdir() if p.suffix in (".safetensors", ".bin") and p.is_file())
    for p in files:
        h.update(p.name.encode())
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def reward_model_dir(spec: str, cache_dir: str) -> Path:
    """The directory `spec` names: a path holding reward_model.json, or a name under
    `<model.cache_dir>/reward-models/`."""
    given = Path(spec).expanduser()
    for candidate in (given, Path(cache_dir).expanduser() / SUBDIR / spec):
        if (candidate / RECORD).is_file():
            return candidate.absolute()
    raise ConfigError(f"reward.reward_model {spec!r} is no reward-model directory (no {RECORD} at {given} or under "
                      f"{Path(cache_dir).expanduser() / SUBDIR})",
                      "train one with `agentrl reward train --from RUN` and set reward.reward_model to the directory it printed")


def load_base(path: str | Path):
    """(model, tokenizer) of a Hugging Face causal LM directory, in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    model.eval()
    return model, tokenizer


def encode(tokenizer, text: str, max_tokens: int) -> list[int]:
    """The token ids of `text`, its last `max_tokens` kept."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids[-max_tokens:]


def features(model, tokenizer, texts: list[str], max_tokens: int, batch_size: int = 8, progress=None):
    """The base's last hidden state at each text's final token: a float32 tensor [len(texts), hidden]."""
    import torch

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    base = model.base_model  # the decoder without the LM head
    out = []
    with torch.no_grad():
        for start in range(0, len(texts), batch_size):
            batch = [encode(tokenizer, t, max_tokens) or [pad] for t in texts[start:start + batch_size]]
            width = max(len(ids) for ids in batch)
            input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids in batch])
            mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids in batch])
            hidden = base(input_ids=input_ids, attention_mask=mask).last_hidden_state
            last = torch.tensor([len(ids) - 1 for ids in batch])
            out.append(hidden[torch.arange(len(batch)), last].float())
            if progress is not None:
                progress(min(start + batch_size, len(texts)), len(texts))
    return torch.cat(out) if out else torch.zeros(0, model.config.hidden_size)


@dataclass
class Head:
    """The value head on standardised features: logit = weight · (x - mean) / std + bias."""

    weight: object  # torch tensors
    bias: object
    mean: object
    std: object

    def logits(self, x):
        return ((x - self.mean) / self.std) @ self.weight + self.bias

    def save(self, path: Path) -> None:
        from safetensors.torch import save_file

        save_file({k: getattr(self, k).detach().float().contiguous().reshape(-1) for k in ("weight", "bias", "mean", "std")},
                  str(path), metadata={"format": "pt"})

    @classmethod
    def load(cls, path: Path) -> "Head":
        from safetensors.torch import load_file

        t = load_file(str(path))
        return cls(t["weight"], t["bias"][0], t["mean"], t["std"])


def platt(logit: float, calibration: dict) -> float:
    z = calibration["a"] * logit + calibration["b"]
    return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


def version_of(directory: Path, record: dict) -> str:
    h = hashlib.sha256((Path(directory) / HEAD).read_bytes())
    h.update(json.dumps([record["calibration"], record["base"]["weights_sha256"], record["render_version"],
                         record["max_tokens"]], sort_keys=True).encode())
    return "rm-" + h.hexdigest()[:16]


class RewardModelVerifier:
    """Scores a trajectory with the reward model `reward.reward_model` names: p(success) in [0, 1]."""

    name = "reward_model"

    def __init__(self, config) -> None:
        spec = config.reward.reward_model
        if not spec:
            raise ConfigError("reward_model is named as a scorer but reward.reward_model is empty",
                              "set reward.reward_model to the directory `agentrl reward train` printed")
        self.directory = reward_model_dir(spec, config.model.cache_dir)
        try:
            self.record = json.loads((self.directory / RECORD).read_text(encoding="utf-8"))
            self.head = Head.load(self.directory / HEAD)
        except (OSError, ValueError, KeyError) as exc:
            raise ConfigError(f"reward model {self.directory} cannot be read ({type(exc).__name__}: {exc})",
                              "train it again with `agentrl reward train --from RUN`") from None
        if self.record.get("format_version") != FORMAT_VERSION or self.record.get("render_version") != RENDER_VERSION:
            raise ConfigError(f"reward model {self.directory} has format {self.record.get('format_version')} / rendering "
                              f"{self.record.get('render_version')}; this agentrl reads {FORMAT_VERSION} / {RENDER_VERSION}",
                              "train it again with `agentrl reward train --from RUN`")
        base = Path(self.record["base"]["path"])
        if not (base / "config.json").is_file():
            raise ConfigError(f"reward model {self.directory}: its base model {base} is gone",
                              "restore the base model there, or train the reward model again with --base")
        if weights_digest(base) != self.record["base"]["weights_sha256"]:
            raise ConfigError(f"reward model {self.directory}: the weights of its base {base} changed since it was trained",
                              "train the reward model again (`agentrl reward train --from RUN --base MODEL`)")
        self.version = version_of(self.directory, self.record)
        self.max_tokens = int(self.record["max_tokens"])
        self.model, self.tokenizer = load_base(base)
        self._lock = threading.Lock()  # one forward pass at a time: the scorer calls verify from many threads

    def logit(self, text: str) -> float:
        with self._lock:
            x = features(self.model, self.tokenizer, [text], self.max_tokens)
            return float(self.head.logits(x)[0])

    def verify(self, req: ScoreRequest) -> Verdict:
        try:
            logit = self.logit(render_request(req))
        except Exception as exc:  # noqa: BLE001 - a failed forward pass is infrastructure, not the agent's zero
            raise VerifierError(f"reward model forward pass failed: {type(exc).__name__}: {exc}") from exc
        if not math.isfinite(logit):
            raise VerifierError(f"reward model gave a non-finite logit {logit}")
        p = platt(logit, self.record["calibration"])
        return Verdict(p, detail=f"reward model {self.directory.name}: p(success) {p:.3f}")
