"""Off-policy corrections in real training on a random tiny model: the DeepSpeed backend computes
pi_old from the step's starting weights (on-policy samples give weights of 1 and the plain loss;
noisy server log-probs give non-trivial weights, rejections, a finite loss), and a whole run of two
steps with `training.correction: tis` and `mis` writes the diagnostics into its metrics rows."""

from __future__ import annotations

import asyncio
import json
import math
import random
from pathlib import Path

import pytest
import torch

from agentrl_cli.config import load_config
from agentrl_cli.config.models import TrainingConfig
from agentrl_cli.runtime.observe import keys
from agentrl_cli.run.training_run import TrainingRun
from agentrl_cli.learner.deepspeed_backend import DeepSpeedBackend
from agentrl_cli.learner.grpo import Sample, collate, token_logprobs
from tests.conftest import free_port
from tests.integration.conftest import needs_bwrap

pytestmark = pytest.mark.integration
WEIGHT_KEYS = [keys.train_name(k) for k in keys.TRAIN_CORRECTION]


def samples(model, noise: float, seed: int = 0, advantages=(1.0, -1.0, 0.5, -0.5)) -> list[Sample]:
    """GRPO samples whose server log-probs are the model's own plus seeded noise; completions of
    different lengths, staleness alternating 0 and 1."""
    rng = random.Random(seed)
    out = []
    for i, adv in enumerate(advantages):
        prompt, completion = [40 + i % 2, 41, 42, 43, 44], [rng.randrange(50, 120) for _ in range(6 + 2 * i)]
        ids, mask = prompt + completion, [0] * len(prompt) + [1] * len(completion)
        with torch.no_grad():
            lp, _ = token_logprobs(model, collate([Sample(ids, mask, [0.0] * len(ids), 0.0)], 0))
        lps = [v + (rng.gauss(0.0, noise) if m else 0.0) for v, m in zip(lp[0].tolist(), mask)]
        out.append(Sample(ids, mask, lps, adv, staleness=float(i % 2)))
    return out


def one_step(model_dir: Path, noise: float, **training) -> dict:
    cfg = TrainingConfig(**{"micro_batch_size": 2, "learning_rate": 1e-3, "zero_stage": 2, **training})
    backend = DeepSpeedBackend(model_dir, cfg)
    try:
        return backend.train_step(samples(backend.module, noise))
    finally:
        backend.close()


def test_on_policy_samples_give_unit_weights_and_the_plain_loss(random_model_dir):
    plain = one_step(random_model_dir, 0.0)
    decoupled = one_step(random_model_dir, 0.0, correction="decoupled")
    assert decoupled["loss"] == pytest.approx(plain["loss"], abs=1e-5)
    assert decoupled["is_weight_mean"] == pytest.approx(1.0, abs=1e-4)
    assert decoupled["is_rejected_fraction"] == 0.0 and decoupled["is_ess"] == pytest.approx(1.0, abs=1e-6)
    assert not any(k in plain for k in WEIGHT_KEYS)  # correction none: no pi_old, no weights
    # staleness 0, 1, 0, 1 on 6, 8, 10, 12 trained tokens (position 0 is never trained; the prompts come first)
    assert plain["policy_lag"] == decoupled["policy_lag"] == pytest.approx((8 + 12) / 36)


def test_noisy_server_logprobs_give_rejections_and_a_finite_loss(random_model_dir):
    m = one_step(random_model_dir, 0.8, correction="mis", mis_low=0.5, mis_high=2.0)
    assert 0.0 < m["is_rejected_fraction"] < 1.0 and 0.0 < m["is_ess"] < 1.0
    assert m["is_weight_max"] > 2.0 and m["is_weight_p99"] <= m["is_weight_max"]
    assert math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"])


def test_pi_old_is_the_training_forwards_own_log_probs_where_no_dropout_changes_it(random_model_dir):
    """The weights of every micro-batch's training forward are the step's starting weights (one optimizer
    step, after the last), so without dropout the step takes pi_old from that forward and runs no
    separate pass; the loss, the weights and the gradient are the separate pass's."""
    cfg = TrainingConfig(micro_batch_size=2, learning_rate=1e-3, zero_stage=2, correction="mis", mis_low=0.5, mis_high=2.0)
    results = []
    for separate in (False, True):
        backend = DeepSpeedBackend(random_model_dir, cfg)
        try:
            passes, original = [], backend._old_logprobs
            backend._old_logprobs = lambda *a: passes.append(1) or original(*a)
            if separate:
                backend._deterministic = False  # as a model with dropout would be
            results.append((backend.train_step(samples(backend.module, 0.8)), len(passes)))
        finally:
            backend.close()
    (reused, reused_passes), (separated, separate_passes) = results
    assert (reused_passes, separate_passes) == (0, 1)
    assert 0.0 < reused["is_rejected_fraction"] < 1.0  # the weights are not trivial
    for key in ("loss", "grad_norm", "is_weight_mean", "is_rejected_fraction", "is_ess", "clip_fraction"):
        assert reused[key] == pytest.approx(separated[key], rel=1e-4, abs=1e-5), key


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_a_model_with_dropout_keeps_the_separate_pi_old_pass(random_model_dir, dropout):
    lora = {"rank": 4, "alpha": 8.0, "dropout": dropout, "target_modules": ["q_proj", "v_proj"]}
    backend = DeepSpeedBackend(random_model_dir, TrainingConfig(micro_batch_size=2, correction="tis", lora=lora))
    try:
        assert backend._forward_is_deterministic() is (dropout == 0.0)
    finally:
        backend.close()


def test_two_ranks_report_the_diagnostics_of_all_their_tokens(random_model_dir, tmp_path):
    from agentrl_cli.config.models import PlatformConfig
    from agentrl_cli.learner.ranks_backend import RanksBackend

    training = {"micro_batch_size": 2, "learning_rate": 1e-3, "zero_stage": 2, "correction": "mis", "mis_low": 0.5,
                "mis_high": 2.0, "clip_ratio_high": 0.28}
    one = DeepSpeedBackend(random_model_dir, TrainingConfig(**training))
    try:
        batch = samples(one.module, 0.8, seed=1, advantages=(1.0, -1.0, 0.5, -0.5, 0.8, -0.8))
        single = one.train_step(batch)
    finally:
        one.close()
    cfg = PlatformConfig()
    cfg = cfg.model_copy(update={"training": TrainingConfig(world_size=2, **training)})
    ranks = RanksBackend(random_model_dir, cfg, tmp_path / "run")
    try:
        two = ranks.train_step(batch)
    finally:
        ranks.close()
    for key in (*WEIGHT_KEYS, "policy_lag", "loss", "mismatch_kl"):
        assert two[key] == pytest.approx(single[key], rel=1e-4, abs=1e-6), key
    assert 0.0 < two["is_rejected_fraction"] < 1.0


@needs_bwrap
@pytest.mark.parametrize("correction", ["tis", "mis"])
def test_two_steps_with_a_correction_write_its_diagnostics_into_the_metrics_rows(tmp_path, random_model_dir, correction):
    sets = {"inference.port": free_port(), "inference.max_new_tokens": 8, "rollout.concurrency": 4,
            "rollout.group_size": 2, "rollout.max_steps_per_trajectory": 1, "rollout.weight_sync_interval_steps": 1,
            "rollout.mode": "sync", "training.micro_batch_size": 4, "training.checkpoint_interval_steps": 100,
            "training.learning_rate": 1e-4, "training.correction": correction, "data.root": str(tmp_path / "store"),
            "model.path": str(random_model_dir)}
    cfg = load_config(None, [f"{k}={v}" for k, v in sets.items()] + ['harnesses=[{"name": "tool_api_like"}]'],
                      env={}).config

    async def go():
        run = TrainingRun(cfg, tmp_path / "run", random_model_dir, run_id=f"corr-{correction}")
        try:
            await run.start()
            return await run.run(2)
        finally:
            await run.close()

    assert asyncio.run(go()).steps == 2
    rows = [r for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) if keys.is_step_row(r)]
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        for key in (*keys.TRAIN_CORRECTION, keys.TRAIN_MISMATCH_KL, keys.TRAIN_LOSS):
            assert isinstance(row.get(key), float) and math.isfinite(row[key]), (key, row.get(key))
        assert 0.0 <= row[keys.TRAIN_IS_REJECTED_FRACTION] <= 1.0 and 0.0 < row[keys.TRAIN_IS_ESS] <= 1.0
