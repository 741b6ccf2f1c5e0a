"""An async run with room for one version of lag publishes weights and writes checkpoints off the
trainer's path, and generates no episode its remaining steps cannot train: every sync still
verified, every checkpoint complete, the per-step breakdown recorded, and generated == trained."""

from __future__ import annotations

import asyncio
import json

import pytest

from agentrl_cli.config import load_config
from agentrl_cli.run.training_run import TrainingRun
from tests.conftest import free_port
from tests.integration.conftest import needs_bwrap

pytestmark = [pytest.mark.integration, needs_bwrap]
STEPS = 3


def test_async_run_overlaps_sync_and_checkpoint_and_bounds_generation(tmp_path, random_model_dir):
    sets = {"inference.port": free_port(), "inference.max_new_tokens": 8, "rollout.concurrency": 8,
            "rollout.group_size": 2, "rollout.max_steps_per_trajectory": 1, "rollout.weight_sync_interval_steps": 1,
            "rollout.mode": "async", "rollout.max_staleness": 1, "training.micro_batch_size": 4,
            "training.checkpoint_interval_steps": 1, "data.root": str(tmp_path / "store"), "model.path": str(random_model_dir)}
    cfg = load_config(None, [f"{k}={v}" for k, v in sets.items()] + ['harnesses=[{"name": "terminal_like"}]'], env={}).config

    async def go():
        run = TrainingRun(cfg, tmp_path / "run", random_model_dir, run_id="overlap")
        try:
            await run.start()
            return await run.run(STEPS)
        finally:
            await run.close()
    summary = asyncio.run(go())
    assert summary.steps == STEPS and summary.version == STEPS
    # each publish overlapped the next train step, yet every server read-back matched what was exported
    assert [s["version"] for s in summary.syncs] == [1, 2, 3] and all(s["verified_tensors"] >= 1 for s in summary.syncs)
    assert summary.checkpoints == [f"step-{i:08d}" for i in range(1, STEPS + 1)]
    assert all((tmp_path / "run" / "checkpoints" / name).is_dir() for name in summary.checkpoints[-1:])
    generated = sum(v for k, v in summary.counters.items() if k.startswith("termination_"))
    errors = summary.counters.get("episode_errors", 0)
    dropped = summary.counters.get("buffer/dropped_stale", 0)
    assert STEPS * 4 - errors <= generated <= STEPS * 4 + dropped, summary.counters  # nothing beyond what is trained
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if '"time/step_s"' in x]
    assert len(rows) == STEPS
    for key in ("time/wait_s", "time/train_s", "time/sync_s", "time/checkpoint_s", "time/other_s", "time/generate_s",
                "time/reward_s", "time/store_s", "time/env_s", "rollout/episodes_step"):
        assert all(r[key] is not None and r[key] >= 0 for r in rows), key
    assert sum(r["rollout/episodes_step"] for r in rows) <= generated
