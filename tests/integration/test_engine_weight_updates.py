"""Weight updates reuse the model the previous update retired (no deep copy after the first) and
still start from the weights being served: a partial update never brings back older values."""

from __future__ import annotations

import pytest
import torch

from agentrl_cli.engines.inference.engine import HFEngine
from agentrl_cli.model.tiny import build_random

pytestmark = pytest.mark.integration


def test_partial_updates_build_on_the_serving_weights_in_a_reused_model(tmp_path):
    engine = HFEngine(build_random(tmp_path / "m", seed=2), weight_version="0")
    try:
        a, b = "model.layers.0.mlp.up_proj.weight", "model.layers.1.self_attn.q_proj.weight"
        params = dict(engine.named_parameters())
        original_b = params[b].detach().clone()
        first = engine._model
        assert engine.update_weights_from_tensors({a: torch.full_like(params[a], 1.0)}, weight_version="1")[0]
        assert engine._spare is first  # retired by the swap, kept for the next update
        assert engine.update_weights_from_tensors({b: torch.full_like(params[b], 2.0)}, weight_version="2")[0]
        assert engine._model is first  # the retired model came back, refreshed
        now = dict(engine.named_parameters())
        assert torch.all(now[a] == 1.0) and torch.all(now[b] == 2.0)
        assert engine.update_weights_from_tensors({}, weight_version="3")[0]
        again = dict(engine.named_parameters())
        assert torch.all(again[a] == 1.0) and torch.all(again[b] == 2.0) and not torch.equal(again[b], original_b)
        assert engine.weight_version == "3"
    finally:
        engine.close()
