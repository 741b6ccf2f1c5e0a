"""`agentrl plan`'s arithmetic against numbers computed independently here, on a real model directory."""

from __future__ import annotations

import math

import pytest

from agentrl_cli.config import load_config
from agentrl_cli.ops.plan import PlanInputs, build_plan, model_shape, zero_state_bytes


@pytest.fixture(scope="module")
def setup(random_model_dir):
    cfg = load_config(None, [f"model.path={random_model_dir}", "training.world_size=2", "training.zero_stage=2",
                             "rollout.concurrency=10", "inference.replicas=2", "model.context_length=512"]).config
    return cfg, model_shape(cfg.model)


def test_parameter_count_equals_the_loaded_model(setup, random_model_dir):
    from transformers import AutoModelForCausalLM

    _, shape = setup
    model = AutoModelForCausalLM.from_pretrained(random_model_dir)
    assert shape.params == sum(p.numel() for p in model.parameters())
    assert shape.layers == model.config.num_hidden_layers


def test_zero_stages_shard_what_they_should():
    p = 1000
    assert zero_state_bytes(p, "fp32", 0, 4) == {"weights": 4000, "gradients": 4000, "optimizer": 8000}
    assert zero_state_bytes(p, "bf16", 1, 4) == {"weights": 2000, "gradients": 2000, "optimizer": 3000}
    assert zero_state_bytes(p, "bf16", 3, 4) == {"weights": 500, "gradients": 500, "optimizer": 3000}


def test_plan_lines_match_independent_arithmetic(setup):
    cfg, shape = setup
    lines = {ln.item: ln for ln in build_plan(cfg, shape, PlanInputs(step_seconds=30))}
    p = shape.params
    per_rank = (p * 4 + p * 4 / 2 + p * 8 / 2) * 1.2  # fp32, ZeRO-2 over 2 ranks: gradients and optimizer sharded
    assert lines["memory per rank"].value == pytest.approx(per_rank / 1e9)
    kv = 2 * shape.layers * shape.kv_heads * shape.head_dim * 4 * 512 * math.ceil(10 / 2)
    assert lines["KV cache per server"].value == pytest.approx(kv / 1e9)
    assert lines["CPU cores"].value == pytest.approx(10.0)  # two trained harnesses at 1 core, half the episodes each
    assert lines["checkpoint size"].value == pytest.approx(p * 12 / 1e9)
    assert lines["checkpoints written per day"].value == pytest.approx(p * 12 * 86400 / (30 * 10) / 1e9)
    assert all(ln.formula for ln in lines.values())


def test_fsdp_memory_is_planned_as_fully_sharded(setup):
    cfg, shape = setup
    fsdp = cfg.model_copy(update={"training": cfg.training.model_copy(update={"backend": "fsdp"})})
    line = {ln.item: ln for ln in build_plan(fsdp, shape, PlanInputs())}["memory per rank"]
    p = shape.params
    assert line.value * 1e9 == pytest.approx((p * 4 / 2 + p * 4 / 2 + p * 8 / 2) * 1.2, rel=1e-9)  # zero_stage 2 is not read
    assert "FSDP" in line.formula
