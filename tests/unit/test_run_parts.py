"""One run state (run/parts.py): the parts are frozen and the run's old attributes read them and the
state; the trainer's wait for a step's groups is `training.step_wait_timeout_s` and nothing else;
a restart after a start that crashed before its trainer existed still finds the latest checkpoint."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import pytest

from agentrl_cli.config import load_config
from agentrl_cli.learner.checkpoint import CheckpointManager
from agentrl_cli.run.attempts import next_attempt
from agentrl_cli.run.loop.restarts import TrainerCrashed
from agentrl_cli.run.loop.steps import RunSummary, StepLoop
from agentrl_cli.run.training_run import TrainingRun
from agentrl_cli.runtime.observe import keys
from tests.unit.test_sample_shaping import FakeRun, cfg_with, group


def step(run: FakeRun, *, arrives: list | None = None, after_s: float = 0.0) -> dict:
    """One sync-mode step of `run`'s loop; `arrives`: a group put into the buffer `after_s` seconds in."""
    async def body() -> dict:
        loop = StepLoop(run.parts, run.state, run.cfg.rollout, run.cfg.training, run.cfg.observe)

        async def late() -> None:
            await asyncio.sleep(after_s)
            for e in arrives:
                await run.parts.buffer.put(e)
        feeder = asyncio.create_task(late()) if arrives else None
        try:  # the test's own bound: a wait that ignored the key fails here instead of hanging
            return await asyncio.wait_for(loop._step(10, True, RunSummary(steps=0, start_step=0, version=0), 0.0), 30)
        finally:
            if feeder is not None:
                await feeder
    return asyncio.run(body())


def test_the_trainers_wait_for_a_steps_groups_ends_at_training_step_wait_timeout_s_naming_it():
    run = FakeRun(cfg_with(**{"training.micro_batch_size": 2, "training.step_wait_timeout_s": 0.3}), [])
    assert run.cfg.rollout.step_timeout_seconds == 60  # which made this wait 600 s before it had a key
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"no complete group in time \(within training.step_wait_timeout_s=0.3 s\)"):
        step(run)
    assert time.monotonic() - t0 < 10
    assert run.trained == [] and run.state.step == 0


def test_rollout_step_timeout_seconds_no_longer_bounds_the_trainers_wait():
    # before: a wait of 10 x 0.02 s, over well before the group arrives at 0.6 s
    cfg = cfg_with(**{"training.micro_batch_size": 2, "rollout.step_timeout_seconds": 0.02,
                      "training.step_wait_timeout_s": 20})
    run = FakeRun(cfg, [])
    row = step(run, arrives=group(1.0, 0.0), after_s=0.6)
    assert [len(b) for b in run.trained] == [2] and run.state.step == 1
    assert row[keys.time_part("wait_s")] >= 0.5


def test_the_step_wait_key_is_typed_bounded_and_defaults_to_todays_wait():
    cfg = load_config(None, [], env={}).config
    assert cfg.training.step_wait_timeout_s == 10 * cfg.rollout.step_timeout_seconds == 600.0
    with pytest.raises(Exception, match="training.step_wait_timeout_s"):
        load_config(None, ["training.step_wait_timeout_s=0"], env={})


def test_run_parts_are_frozen_and_the_runs_old_attributes_read_the_parts_and_the_state(tmp_path):
    cfg = load_config(None, [], env={}).config
    run = TrainingRun(cfg, tmp_path / "run", Path("model"), run_id="views")
    try:
        assert run.ckpt is run.parts.checkpoints and run.metrics is run.parts.metrics
        assert run.client is None and run.servers == () and run.backend is None  # not started: not built
        run.step, run.restarts = 7, 2
        run.ledger.append({"step": 7, "draws": []})
        assert (run.state.step, run.state.restarts, run.state.ledger) == (7, 2, [{"step": 7, "draws": []}])
        with pytest.raises(AttributeError, match="part of the run"):
            run.client = object()
        with pytest.raises(dataclasses.FrozenInstanceError):
            run.parts.client = object()
    finally:
        run.metrics.close()


def _checkpoint(root: Path, step: int) -> str:
    return CheckpointManager(root, 3).save(step, lambda d: (d / "engine").mkdir(), {"version": 1, "run_id": "r"}).name


def test_a_restart_after_a_start_that_crashed_before_its_trainer_resumes_from_the_latest_checkpoint(tmp_path):
    cfg = load_config(None, ["training.max_restarts=2"], env={}).config
    name = _checkpoint(tmp_path / "run" / "checkpoints", 4)  # an earlier attempt's
    run = TrainingRun(cfg, tmp_path / "run", Path("model"), run_id="r")  # its start crashed before any part existed
    run.metrics.close()
    restarts, said = [], []
    attempt = next_attempt(cfg, [run], restarts, "rank_died", TrainerCrashed("the ranks did not start"), said.append)
    assert attempt.training.resume_from_latest is True
    assert restarts[0][keys.RESTART_FROM] == name and restarts[0][keys.TRAINER_RESTARTS] == 1
    assert name in said[0]


def test_a_run_told_not_to_resume_restarts_only_from_a_checkpoint_it_wrote(tmp_path):
    cfg = load_config(None, ["training.resume_from_latest=false", "training.max_restarts=2"], env={}).config
    _checkpoint(tmp_path / "run" / "checkpoints", 4)  # left by another run in the same directory
    run = TrainingRun(cfg, tmp_path / "run", Path("model"), run_id="r")
    run.metrics.close()
    restarts: list[dict] = []
    attempt = next_attempt(cfg, [run], restarts, "error", TrainerCrashed("boom"), lambda msg: None)
    assert attempt.training.resume_from_latest is False and restarts[0][keys.RESTART_FROM] is None
    run.checkpoints_written.append(_checkpoint(tmp_path / "run" / "checkpoints", 6))  # one of its own
    attempt = next_attempt(cfg, [run], restarts, "error", TrainerCrashed("boom"), lambda msg: None)
    assert attempt.training.resume_from_latest is True and restarts[1][keys.RESTART_FROM] == run.checkpoints_written[-1]


def test_a_fixed_opponents_requests_end_at_rollout_opponent_timeout_s_not_the_environment_steps():
    """`rollout.step_timeout_seconds` is an environment step's deadline only; a fixed opponent's
    inference client has its own (`rollout.opponent_timeout_s`, default 60 s as before)."""
    from types import SimpleNamespace

    from agentrl_cli.config import load_config
    from agentrl_cli.runtime.rollout.multi_play import Seating

    cfg = load_config(None, ["rollout.opponent_timeout_s=7", "rollout.step_timeout_seconds=3"], env={}).config
    opponent = Seating(SimpleNamespace(config=cfg, client=None)).client("http://127.0.0.1:9")
    assert opponent.timeout_s == 7
    assert load_config(None, [], env={}).config.rollout.opponent_timeout_s == 60.0
