"""Invariant test in the style of TRL's: a fixed-seed 5-step GRPO run of the DeepSpeed backend on a
fixed random tiny model must reproduce the committed per-step loss and gradient norm. A silent
change to the loss, the masking, the advantages or the optimizer shows up here first.

Regenerate (only after an intended change, and say why in the commit):
    REGEN_GOLDEN=1 .venv/bin/python -m pytest tests/integration/test_golden_grpo.py
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
import torch

from agentrl_cli.config import load_config
from agentrl_cli.model.tiny import build_random
from agentrl_cli.learner.deepspeed_backend import DeepSpeedBackend
from agentrl_cli.learner.grpo import Sample, group_advantages

pytestmark = pytest.mark.integration
GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "grpo_5_steps.json"


def samples(step: int) -> list[Sample]:
    rng = random.Random(1000 + step)
    rewards = [float(rng.random() < 0.5) for _ in range(8)]
    adv = group_advantages(rewards, [f"g{i // 4}" for i in range(8)])
    out = []
    for a in adv:
        prompt, completion = rng.randint(8, 24), rng.randint(4, 16)
        ids = [rng.randrange(32, 127) for _ in range(prompt + completion)]
        out.append(Sample(token_ids=ids, loss_mask=[0] * prompt + [1] * completion,
                          logprobs=[0.0] * prompt + [-rng.uniform(0.5, 6.0) for _ in range(completion)], advantage=a))
    return out


def run_five_steps(tmp_path) -> list[dict]:
    torch.manual_seed(0)
    model = build_random(tmp_path / "tiny", seed=123)
    cfg = load_config(None, ["training.micro_batch_size=4", "training.learning_rate=1e-3", "training.zero_stage=2"],
                      env={}).config
    backend = DeepSpeedBackend(str(model), cfg.training)
    try:
        return [{k: round(float(m[k]), 6) for k in ("loss", "grad_norm")} for m in (backend.train_step(samples(s)) for s in range(5))]
    finally:
        backend.close()


def test_five_step_run_matches_the_committed_reference(tmp_path):
    got = run_five_steps(tmp_path)
    if os.environ.get("REGEN_GOLDEN") == "1":
        GOLDEN.write_text(json.dumps({"steps": got, "torch": torch.__version__}, indent=2) + "\n")
    expected = json.loads(GOLDEN.read_text())["steps"]
    assert len(got) == len(expected) == 5
    for step, (g, e) in enumerate(zip(got, expected)):
        for key in ("loss", "grad_norm"):
            assert g[key] == pytest.approx(e[key], rel=1e-3, abs=1e-5), (step, key, g[key], e[key])
    assert len({round(s["loss"], 4) for s in got}) > 1  # the steps differ: the model really changes
