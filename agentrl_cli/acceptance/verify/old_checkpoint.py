"""A checkpoint written by an earlier checkpoint format, kept with agentrl, that this version must
still load and train from: checkpoints have to load across versions.

`fixtures/checkpoint-v<N>/` holds a very small random model (`model/`) and one checkpoint of it
(`checkpoints/step-00000001/`, the checkpoint manager's layout and DeepSpeed's files) written by
format version N, with `fixture.json` naming the format version and the trainer settings used;
`fixtures/checkpoint-v<N>-<backend>/` the same written by another training backend (`fsdp`).
`python -m agentrl_cli.acceptance.verify.old_checkpoint [BACKEND]` writes the fixture of the current format
version; commit it before the format changes, and keep the older ones.
"""

from __future__ import annotations

import json
import math
import shutil
from functools import lru_cache
from pathlib import Path

FIXTURES = Path(__file__).with_name("fixtures")
ARCH = dict(hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2)
TRAINING = dict(micro_batch_size=2, gradient_accumulation_steps=1, zero_stage=2, world_size=1, learning_rate=1e-3)


def _samples():
    from agentrl_cli.learner.grpo import Sample

    ids = list(range(5, 17))
    mask = [0] * 4 + [1] * 8
    return [Sample(token_ids=ids, loss_mask=mask, logprobs=[-1.0] * 12, advantage=a) for a in (1.0, -1.0)]


def write_fixture(root: Path | None = None, backend_name: str = "deepspeed") -> Path:
    from agentrl_cli.config.models import TrainingConfig
    from agentrl_cli.model.tiny import build_random
    from agentrl_cli.learner.backend import backend_class
    from agentrl_cli.learner.checkpoint import SCHEMA_VERSION, CheckpointManager

    suffix = "" if backend_name == "deepspeed" else f"-{backend_name}"
    root = root or FIXTURES / f"checkpoint-v{SCHEMA_VERSION}{suffix}"
    if root.exists():
        shutil.rmtree(root)
    training = {**TRAINING, "backend": backend_name}
    model = build_random(root / "model", seed=3, **ARCH)
    config = TrainingConfig(**training)
    backend = backend_class(config)(str(model), config)
    try:
        backend.train_step(_samples())
        CheckpointManager(root / "checkpoints").save(1, lambda d: _save_weights_only(backend, d / "engine"),
                                                     {"version": 1, "run_id": "fixture"})
    finally:
        backend.close()
    (root / "fixture.json").write_text(json.dumps({"format_version": SCHEMA_VERSION, "backend": backend_name, "training": training,
                                                   "arch": ARCH}, indent=2) + "\n")
    return root


def _save_weights_only(backend, engine_dir: Path) -> None:
    """The checkpoint without the conversion scripts DeepSpeed copies beside it (zero_to_fp32.py):
    loading never runs them, and the fixture keeps only what a load reads."""
    backend.save_checkpoint(engine_dir, {"step": 1, "version": 1})
    for script in engine_dir.glob("zero_to_*.py"):
        script.unlink()


@lru_cache(maxsize=None)
def load_and_step(root: Path) -> dict:
    """Load the fixture's checkpoint with this version's code and take one training step; the
    result depends only on the code, so it is computed once per process."""
    from agentrl_cli.config.models import TrainingConfig
    from agentrl_cli.learner.backend import backend_class
    from agentrl_cli.learner.checkpoint import CheckpointManager

    meta = json.loads((root / "fixture.json").read_text())
    latest = CheckpointManager(root / "checkpoints").latest()
    if latest is None:
        return {"ok": False, "why": f"no complete checkpoint under {root / 'checkpoints'}"}
    config = TrainingConfig(**meta["training"])  # fixtures without a backend were written by DeepSpeed
    backend = backend_class(config)(str(root / "model"), config)
    try:
        state = backend.load_checkpoint(latest / "engine")
        loss = backend.train_step(_samples())["loss"]
    finally:
        backend.close()
    ok = state.get("step") == 1 and math.isfinite(loss)
    return {"ok": ok, "format_version": meta["format_version"], "checkpoint": latest.name, "step": state.get("step"),
            "loss_after_one_step": round(loss, 6)}


def fixtures() -> list[Path]:
    return sorted(p for p in FIXTURES.glob("checkpoint-v*") if (p / "fixture.json").exists())


if __name__ == "__main__":
    import sys

    print(f"wrote {write_fixture(backend_name=sys.argv[1] if len(sys.argv) > 1 else 'deepspeed')}")
