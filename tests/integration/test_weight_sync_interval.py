"""The loop at the default `rollout.weight_sync_interval_steps` (4), async as by default, on a random
tiny model: weights are published after steps 4, 8, ... only; each stored episode says which policy
version generated it (`policy_version_first/last`); each step row's `rollout/staleness_mean` is the
mean, over the episodes that step trained (the ledger's groups), of the policy versions between the
weights that generated them and the trainer's version at that step, and `train/policy_lag` (what the
off-policy corrections are handed as `Sample.staleness`) agrees with it. Staleness counts published
policy versions, not trainer steps: steps 1-4 train on version 0's episodes at staleness 0. Sync
mode generates step 5's episodes with version 1; async mode generates them ahead, mostly by
version 0 (the rollout's lead allows max_staleness versions), and they train at staleness 1."""

from __future__ import annotations

import asyncio
import statistics

import pytest

from agentrl_cli.config import load_config
from agentrl_cli.runtime.data.local_store import LocalStore
from agentrl_cli.runtime.data.writer import read_records
from agentrl_cli.runtime.observe import keys
from agentrl_cli.runtime.rollout.controller import version_number
from agentrl_cli.run.training_run import training
from tests.conftest import free_port
from tests.integration.conftest import needs_bwrap

pytestmark = [pytest.mark.integration, needs_bwrap]
STEPS = 5


@pytest.mark.parametrize("mode", ["async", pytest.param("sync", marks=pytest.mark.long)])  # sync: ~10 s more, left to -m long
def test_at_the_default_sync_interval_each_step_counts_the_staleness_of_the_episodes_it_trained(tmp_path, random_model_dir,
                                                                                                 mode):
    sets = {"rollout.mode": mode, "inference.port": free_port(), "inference.max_new_tokens": 8, "rollout.concurrency": 4, "rollout.group_size": 2,
            "rollout.max_steps_per_trajectory": 1, "training.micro_batch_size": 4, "training.checkpoint_interval_steps": 100,
            "training.correction": "tis", "data.root": str(tmp_path / "store"), "model.path": str(random_model_dir)}
    cfg = load_config(None, [f"{k}={v}" for k, v in sets.items()] + ['harnesses=[{"name": "terminal_like"}]'], env={}).config
    assert (cfg.rollout.weight_sync_interval_steps, cfg.rollout.max_staleness) == (4, 2)

    async def go():
        async with training(cfg, tmp_path / "run", random_model_dir, run_id="interval") as run:
            summary = await run.run(STEPS)
            return summary, list(run.state.ledger)
    summary, ledger = asyncio.run(go())

    assert [r[keys.VERSION] for r in summary.metrics] == [0, 0, 0, 1, 1]  # the version after each step
    assert [s["version"] for s in summary.syncs if s.get("version")] == [1]  # one publish, after step 4
    by_group: dict[str, list] = {}
    for record in read_records(LocalStore(tmp_path / "store")):
        by_group.setdefault(record.group_id, []).append(record)
    generated_by = []  # per step: the versions that generated its episodes
    for entry, row in zip(ledger, summary.metrics):
        trainer_version = (entry["step"] - 1) // 4  # the trainer's version when the step built its samples
        episodes = [r for d in entry["draws"] for r in by_group[d["group_id"]]]
        assert len(episodes) == sum(d["episodes"] for d in entry["draws"])  # every trained episode was stored
        versions = [version_number(r.policy_version_first) for r in episodes]
        assert all(version_number(r.policy_version_last) >= v for r, v in zip(episodes, versions))
        generated_by.append(set(versions))
        lags = [trainer_version - v for v in versions]
        assert min(lags) >= 0 and max(lags) <= cfg.rollout.max_staleness
        assert row[keys.ROLLOUT_STALENESS_MEAN] == pytest.approx(statistics.fmean(lags)), entry["step"]
        if len(set(lags)) == 1:  # token-weighted over the samples: equal to every sample's own when they agree
            assert row[keys.TRAIN_POLICY_LAG] == pytest.approx(lags[0]), entry["step"]
        else:
            assert min(lags) < row[keys.TRAIN_POLICY_LAG] < max(lags), entry["step"]
    assert all(row[keys.ROLLOUT_STALENESS_MEAN] == 0 for row in summary.metrics[:4])  # steps 1-4: version 0 throughout
    if mode == "sync":  # each step's episodes generated after the step before: by version 1 from step 5 on, never stale
        assert generated_by == [{0}] * 4 + [{1}] and all(row[keys.ROLLOUT_STALENESS_MEAN] == 0 for row in summary.metrics)
    else:  # the rollout runs ahead of the trainer (up to max_staleness versions): step 5 trains version 0's episodes
        # (staleness 1), or version 1's where the trainer got there first; which, the two machines' speeds decide
        assert generated_by[:4] == [{0}] * 4 and all(g <= {0, 1} for g in generated_by[4:])
