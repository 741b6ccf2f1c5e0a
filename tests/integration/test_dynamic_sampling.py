"""Dynamic sampling on the whole loop (random tiny model, sync mode, DeepSpeed GRPO on one gloo
rank; sync and async rollout): the trainer is never handed a step whose groups all have equal rewards; such a step is
skipped and counted in its row. The random model's rewards are all equal, so a soft overlong penalty
over nearly the whole sequence limit (`overlong_buffer_tokens`) is what gives some groups a signal
(episodes of different lengths); the steps it trains use `loss_aggregation: seq_mean_token_sum`."""

from __future__ import annotations

import asyncio
import json

import pytest

from agentrl_cli.runtime.observe import keys
from agentrl_cli.run.training_run import TrainingRun
from tests.integration.conftest import needs_bwrap
from tests.integration.test_training_loop import config

pytestmark = [pytest.mark.integration, needs_bwrap]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_trainer_never_gets_a_batch_of_only_flat_groups(tmp_path, random_model_dir, mode):
    cfg = config(tmp_path, random_model_dir, **{"rollout.mode": mode,"rollout.dynamic_sampling": "true", "rollout.max_refill_rounds": 1,
                                                "training.overlong_buffer_tokens": 1984, "training.overlong_penalty": 0.5,
                                                "training.loss_aggregation": "seq_mean_token_sum"})
    handed: list[list[float]] = []

    async def go():
        run = TrainingRun(cfg, tmp_path / "run", random_model_dir, run_id="dyn")
        try:
            await run.start()
            train_step = run.backend.train_step

            def recording(samples):
                handed.append([s.advantage for s in samples])
                return train_step(samples)
            run.backend.train_step = recording
            return await run.run(3)
        finally:
            await run.close()
    summary = asyncio.run(go())
    assert summary.steps == 3
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "step" in r and not keys.is_eval_row(r)]
    assert [r["step"] for r in steps] == [1, 2, 3]
    # group_size 2: a group with signal has two different rewards, so both its advantages are non-zero
    assert all(advantages and all(a != 0 for a in advantages) for advantages in handed)
    skipped = 0
    for r in steps:
        assert keys.ROLLOUT_DROPPED_FLAT_GROUPS in r and keys.ROLLOUT_REFILL_ROUNDS in r
        if keys.TRAIN_LOSS in r:
            assert r[keys.REWARD_STD] > 0
        else:
            skipped += 1
        assert r[keys.ROLLOUT_SKIPPED_STEPS] == skipped
    assert len(handed) == 3 - skipped and handed, "no step trained: the overlong penalty gave no group a signal"
