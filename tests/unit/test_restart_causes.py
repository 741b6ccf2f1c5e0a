"""What counts as a trainer crash and its cause (run/loop/restarts.py), and how ledgers of trained draws
compare (run/loop/ledger.py)."""

from __future__ import annotations

import torch

from agentrl_cli.core.errors import ConfigError
from agentrl_cli.run.loop.ledger import compare, draw_index, read_ledger, write_ledger
from agentrl_cli.run.loop.restarts import TrainerCrashed, crash_cause, exhausted, restart_row
from agentrl_cli.runtime.observe import keys
from agentrl_cli.learner.ranks_backend import TrainerRanksFailed


def crashed_from(cause: BaseException) -> TrainerCrashed:
    try:
        try:
            raise cause
        except Exception as exc:
            raise TrainerCrashed("the train step of step 3 failed") from exc
    except TrainerCrashed as crash:
        return crash


def test_crash_causes_are_named_and_other_errors_are_not_crashes():
    assert crash_cause(crashed_from(ValueError("bad batch"))) == "error"
    assert crash_cause(crashed_from(torch.OutOfMemoryError("CUDA out of memory"))) == "out_of_memory"
    assert crash_cause(TrainerRanksFailed("trainer rank 1 of 2 died (exit status SIGKILL)", rank=1, exit_status=-9)) == "rank_died"
    assert crash_cause(crashed_from(TrainerRanksFailed("the trainer ranks did not answer train_step within 5 s"))) == "hang"
    assert crash_cause(ConfigError("training.lora is set", "unset it")) is None  # would fail the same way again
    assert crash_cause(RuntimeError("the rollout produced no complete group in time")) is None


def test_restart_rows_and_the_error_past_the_cap_name_the_cause():
    crash = crashed_from(RuntimeError("injected"))
    row = restart_row(1, "error", crash, 2, "step-00000002")
    assert row[keys.EVENT] == keys.TRAINER_RESTART and row[keys.TRAINER_RESTARTS] == 1
    assert row[keys.RESTART_ERROR] == "the train step of step 3 failed: RuntimeError: injected"
    error = exhausted([row, restart_row(2, "error", crash, 2, "step-00000002")], "out_of_memory", crash, 2)
    assert "crashed (out_of_memory: the train step of step 3 failed" in error.message and "after 2 restart(s)" in error.message
    assert "training.micro_batch_size" in error.hint


def test_ledger_comparison_finds_repeated_missing_and_extra_draws(tmp_path):
    def entry(step, *groups):
        return {"step": step, "draws": [{"draw": draw_index(g), "group_id": g, "harness": "h", "task_id": t, "episodes": 2}
                                        for g, t in groups]}
    reference = [entry(1, ("g0-0000000", "a"), ("g0-0000001", "b")), entry(2, ("g0-0000002", "c"), ("g0-0000003", "d"))]
    same = [entry(1, ("g0-0000001", "b"), ("g0-0000000", "a")), entry(2, ("g0-0000003", "d"), ("g0-0000002", "c"))]
    assert compare(same, reference) == {"trained": 4, "reference": 4, "repeated": [], "missing": [], "extra": []}
    skewed = [entry(1, ("g0-0000000", "a"), ("g0-0000001", "b")), entry(2, ("g0-0000001", "b"), ("g0-0000004", "e"))]
    diff = compare(skewed, reference)
    assert diff["repeated"] == [("g0-0000001", "h", "b")]
    assert diff["missing"] == [("g0-0000002", "h", "c"), ("g0-0000003", "h", "d")]
    assert diff["extra"] == [("g0-0000004", "h", "e")]
    assert draw_index("g0-0000004") == 4 and draw_index("eval-3") is None
    write_ledger(tmp_path, reference)
    assert read_ledger(tmp_path) == reference and read_ledger(tmp_path / "older") is None
