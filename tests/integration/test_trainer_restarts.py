"""Trainer crashes and `training.max_restarts` on a random tiny model, the real run (embedded server
process, rollout, reward, store), with a plugin trainer backend that raises at seeded steps.

- An async run crashed at step 3 restarts from its step-2 checkpoint and finishes; its ledger of
  trained draws equals an uninterrupted run's with the same seed (0 missing, 0 repeated, 0 extra),
  though half the tasks play slowly and so were in flight when the checkpoint was taken. The
  uninterrupted run plays exactly the episodes it trains: an async rollout that started more would
  make which draws are trained depend on timing.
- A trainer that crashes on every step stops the run after 2 restarts, naming the cause, with a
  restart row per restart in metrics.jsonl.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
import torch

from agentrl_cli.config import load_config
from agentrl_cli.run.loop.ledger import compare, read_ledger
from agentrl_cli.run.loop.restarts import TrainerRestartsExhausted
from agentrl_cli.runtime.observe import keys
from agentrl_cli.run.training_run import train
from harnesses.tool_api_like import ToolApiLike
from tests.conftest import free_port
from tests.integration.conftest import needs_bwrap
from tests.integration.test_plugin_recipes import PlainTorchBackend

pytestmark = [pytest.mark.integration, needs_bwrap]
SLOW_S = 1.5  # how long a slow task's reset takes: its episodes are still in flight when a step is trained


class CrashingBackend(PlainTorchBackend):
    """PlainTorchBackend whose train step raises at the steps in `crash_at` (each once), or at every
    step with `crash_always`."""

    crash_at: set[int] = set()
    crash_always = False
    crashed: list[int] = []

    def train_step(self, samples) -> dict:
        step = self.step + 1  # restored from the checkpoint after a restart
        if self.crash_always or (step in self.crash_at and step not in self.crashed):
            self.crashed.append(step)
            raise RuntimeError(f"injected trainer fault at step {step}")
        return super().train_step(samples)


def slow_task(task_id: str) -> bool:
    return sum(task_id.encode()) % 2 == 1


@pytest.fixture
def slow_half(monkeypatch):
    """Episode length correlates with the task: half the tasks take SLOW_S longer to reset."""
    reset = ToolApiLike.reset

    def slow_reset(self, task_spec):
        if slow_task(task_spec.task_id):
            time.sleep(SLOW_S)
        return reset(self, task_spec)
    monkeypatch.setattr(ToolApiLike, "reset", slow_reset)


def config(tmp_path: Path, model: Path, **extra):
    sets = {"inference.port": free_port(), "inference.max_new_tokens": 8, "rollout.concurrency": 8,
            "rollout.group_size": 2, "rollout.max_steps_per_trajectory": 1, "rollout.weight_sync_interval_steps": 1,
            "rollout.mode": "async", "rollout.max_staleness": 1, "training.micro_batch_size": 4,
            "training.checkpoint_interval_steps": 2, "training.learning_rate": 1e-4, "data.root": str(tmp_path / "store"),
            "model.path": str(model), "training.backend": f"{__name__}:CrashingBackend", **extra}
    return load_config(None, [f"{k}={v}" for k, v in sets.items()] + ['harnesses=[{"name": "tool_api_like"}]'], env={}).config


def restart_rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get(keys.EVENT) == keys.TRAINER_RESTART]


def test_a_crashed_run_restarts_and_trains_the_draws_an_uninterrupted_run_does(tmp_path, random_model_dir, slow_half):
    steps = 3
    CrashingBackend.crash_at, CrashingBackend.crash_always, CrashingBackend.crashed = set(), False, []
    # a draw dropped as too stale is replaced by the next one, and which draws go stale depends on
    # timing: with max_staleness as long as the run, none can, so the trained draws are the same
    # in every uninterrupted run with this seed, and a resumed run must train exactly those
    no_drops = {"rollout.max_staleness": steps - 1}
    whole = asyncio.run(train(config(tmp_path / "a", random_model_dir, **no_drops), tmp_path / "a", random_model_dir, steps,
                              run_id="whole"))
    assert whole.steps == steps and whole.restarts == []
    # an async run starts no episode it will not train (else which draws are trained depends on timing)
    assert sum(v for k, v in whole.counters.items() if k.startswith("termination_")) == steps * 4, json.dumps(whole.counters)
    assert whole.counters["buffer/dropped_stale"] == 0

    CrashingBackend.crash_at = {3}
    cfg = config(tmp_path / "b", random_model_dir, **{"training.max_restarts": 2, **no_drops})
    crashed = asyncio.run(train(cfg, tmp_path / "b", random_model_dir, steps, run_id="crashed"))
    assert CrashingBackend.crashed == [3]
    assert crashed.steps == steps and crashed.start_step == 0
    assert [m["step"] for m in crashed.metrics] == [1, 2, 3]  # the crashed attempt's steps up to its checkpoint, then the resumed one's
    [restart] = crashed.restarts
    assert restart[keys.RESTART_CAUSE] == "error" and restart[keys.RESTART_FROM] == "step-00000002"
    assert restart[keys.RESTART_LAST_STEP] == 2
    assert "injected trainer fault at step 3" in restart[keys.RESTART_ERROR]
    assert [{k: r[k] for k in restart} for r in restart_rows(tmp_path / "b")] == [restart]  # and the row in metrics.jsonl
    assert crashed.metrics[-1][keys.TRAINER_RESTARTS] == 1

    # the checkpoint resumed from had draws in flight (slow tasks among them), run again after the restart
    state = torch.load(tmp_path / "b" / "checkpoints" / "step-00000002" / "engine" / "state.pt", weights_only=False)
    assert state["client"]["inflight"], "nothing was in flight at the checkpoint: the test would not test in-flight draws"

    reference = read_ledger(tmp_path / "a" / "checkpoints" / f"step-{steps:08d}")
    resumed = read_ledger(tmp_path / "b" / "checkpoints" / f"step-{steps:08d}")
    assert [e["step"] for e in resumed] == [1, 2, 3]
    diff = compare(resumed, reference)
    assert crashed.counters["buffer/dropped_stale"] == 0
    assert diff["trained"] == diff["reference"] == steps * 2, diff
    assert diff["repeated"] == diff["missing"] == diff["extra"] == [], (diff, crashed.counters, whole.counters, state["client"]["inflight"], state["client"]["buffer"])
    assert any(slow_task(task) for _, _, task in {(d["group_id"], d["harness"], d["task_id"])
                                                   for e in resumed for d in e["draws"]})


def test_a_trainer_that_crashes_on_every_step_stops_after_max_restarts_naming_the_cause(tmp_path, random_model_dir):
    CrashingBackend.crash_at, CrashingBackend.crash_always, CrashingBackend.crashed = set(), True, []
    PlainTorchBackend.built.clear()
    cfg = config(tmp_path, random_model_dir, **{"training.max_restarts": 2, "rollout.mode": "sync"})
    with pytest.raises(TrainerRestartsExhausted, match=r"crashed \(error: .*injected trainer fault at step 1.*after 2 restart"):
        asyncio.run(train(cfg, tmp_path / "run", random_model_dir, 2, run_id="always"))
    assert len(PlainTorchBackend.built) == 3 and CrashingBackend.crashed == [1, 1, 1]  # the first start and 2 restarts
    rows = restart_rows(tmp_path / "run")
    assert [r[keys.TRAINER_RESTARTS] for r in rows] == [1, 2]
    assert all(r[keys.RESTART_CAUSE] == "error" and r[keys.RESTART_FROM] is None for r in rows)
