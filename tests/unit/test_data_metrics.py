"""Evaluation metrics: on a hand-built fixture set of ten trajectories the metrics table matches
values computed by hand (written below as literals, with the per-record arithmetic in comments)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from agentrl_cli.runtime.data import schema
from agentrl_cli.runtime.data.metrics import (ALL, METRICS, MetricsError, compute_metrics,
                                      metrics_from_records)
from agentrl_cli.runtime.data.schema import StepRecord, TrajectoryRecord

T, A = "terminal_like", "tool_api_like"


def traj(harness, task_type, phase, outcome, reward, status, actions, tool_calls, tool_failures,
         invalid=0) -> TrajectoryRecord:
    steps = [StepRecord(index=i, action=a, observation="obs") for i, a in enumerate(actions)]
    return TrajectoryRecord(run_id="run-1", task_id=f"{task_type}-1", harness=harness, harness_version="1",
                            task_type=task_type, phase=phase, outcome=outcome, reward=reward,
                            reward_status=status, steps=steps, turns=len(steps), tool_calls=tool_calls,
                            tool_failures=tool_failures, invalid_actions=invalid)


#  #  harness task    phase   outcome    reward status       turns calls fails invalid repeats
FIXTURE = [
    # 1  T    arith   warmup  success    1.0    ok           2     2     0     0       0
    traj(T, "arith", "warmup", "success", 1.0, "ok", ["ls", "cat a"], 2, 0),
    # 2  T    arith   warmup  fail       0.0    fail         3     3     1     1       2 ("ls ", "  ls" repeat "ls")
    traj(T, "arith", "warmup", "fail", 0.0, "fail", ["ls", "ls ", "  ls"], 3, 1, invalid=1),
    # 3  T    arith   train   success    1.0    ok           2     1     0     0       1 ("echo  1" == "echo 1")
    traj(T, "arith", "train", "success", 1.0, "ok", ["echo 1", "echo  1"], 1, 0),
    # 4  T    search  train   timeout    0.0    timeout      4     4     2     0       2 (3rd and 4th "grep x")
    traj(T, "search", "train", "timeout", 0.0, "timeout", ["grep x", "grep y", "grep x", "grep x"], 4, 2),
    # 5  T    search  train   partial    0.5    ok           1     1     0     0       0
    traj(T, "search", "train", "partial", 0.5, "ok", ["find ."], 1, 0),
    # 6  A    arith   warmup  error      0.0    infra_error  1     1     1     0       0
    traj(A, "arith", "warmup", "error", 0.0, "infra_error", ["call add"], 1, 1),
    # 7  A    arith   train   success    1.0    ok           2     1     0     1       0
    traj(A, "arith", "train", "success", 1.0, "ok", ["call add", "answer 3"], 1, 0, invalid=1),
    # 8  A    search  warmup  truncated  0.2    ok           5     5     1     2       2 (3rd "q a", 4th "q b")
    traj(A, "search", "warmup", "truncated", 0.2, "ok", ["q a", "q b", "q a", "q b", "q c"], 5, 1, invalid=2),
    # 9  A    search  train   success    1.0    ok           2     2     0     0       0 ("Q A" != "q a": case counts)
    traj(A, "search", "train", "success", 1.0, "ok", ["q a", "Q A"], 2, 0),
    # 10 A    search  train   fail       0.0    fail         0     0     0     0       0 (no steps)
    traj(A, "search", "train", "fail", 0.0, "fail", [], 0, 0),
]


def by_key(rows, *keys):
    return {tuple(r[k] for k in keys): r for r in rows}


def assert_metrics(row, expected):
    for key, value in expected.items():
        assert row[key] == pytest.approx(value), key


def test_overall_row_matches_hand_computed_values():
    rows = metrics_from_records(FIXTURE, group_by=())
    assert len(rows) == 1
    assert_metrics(rows[0], {
        "n": 10,
        "success_rate": 0.4,               # records 1, 3, 7, 9 -> 4/10
        "partial_rate": 0.1,               # record 5
        "timeout_rate": 0.1,               # record 4
        "abnormal_termination_rate": 0.1,  # record 6 (error); truncated record 8 is not abnormal
        "truncated_rate": 0.1,             # record 8
        "infra_error_rate": 0.1,           # record 6
        "mean_reward": 0.47,               # (1+0+1+0+0.5+0+1+0.2+1+0) = 4.7 / 10
        "mean_turns": 2.2,                 # (2+3+2+4+1+1+2+5+2+0) = 22 / 10
        "mean_tool_calls": 2.0,            # (2+3+1+4+1+1+1+5+2+0) = 20 / 10
        "tool_failure_rate": 0.25,         # (0+1+0+2+0+1+0+1+0+0) = 5 / 20
        "invalid_action_ratio": 4 / 22,    # (1 + 1 + 2) = 4 / 22 turns
        "repeated_action_ratio": 7 / 22,   # (2 + 1 + 2 + 2) = 7 / 22 turns
    })


def test_grouped_by_harness_matches_hand_computed_values():
    rows = by_key(metrics_from_records(FIXTURE, group_by=("harness",)), "harness")
    assert list(rows) == [(T,), (A,), (ALL,)]
    assert_metrics(rows[(T,)], {  # records 1-5
        "n": 5, "success_rate": 0.4, "partial_rate": 0.2, "timeout_rate": 0.2,
        "abnormal_termination_rate": 0.0, "truncated_rate": 0.0, "infra_error_rate": 0.0,
        "mean_reward": 0.5,                # (1+0+1+0+0.5) = 2.5 / 5
        "mean_turns": 2.4,                 # (2+3+2+4+1) = 12 / 5
        "mean_tool_calls": 2.2,            # (2+3+1+4+1) = 11 / 5
        "tool_failure_rate": 3 / 11,       # (0+1+0+2+0) = 3 / 11
        "invalid_action_ratio": 1 / 12,    # record 2's one invalid action / 12 turns
        "repeated_action_ratio": 5 / 12,   # (0+2+1+2+0) = 5 / 12
    })
    assert_metrics(rows[(A,)], {  # records 6-10
        "n": 5, "success_rate": 0.4, "partial_rate": 0.0, "timeout_rate": 0.0,
        "abnormal_termination_rate": 0.2, "truncated_rate": 0.2, "infra_error_rate": 0.2,
        "mean_reward": 0.44,               # (0+1+0.2+1+0) = 2.2 / 5
        "mean_turns": 2.0,                 # (1+2+5+2+0) = 10 / 5
        "mean_tool_calls": 1.8,            # (1+1+5+2+0) = 9 / 5
        "tool_failure_rate": 2 / 9,        # (1+0+1+0+0) = 2 / 9
        "invalid_action_ratio": 0.3,       # (0+1+2+0+0) = 3 / 10
        "repeated_action_ratio": 0.2,      # record 8's 2 repeats / 10 turns
    })
    assert rows[(ALL,)]["n"] == 10 and rows[(ALL,)]["success_rate"] == pytest.approx(0.4)


def test_grouped_by_phase_separates_warmup_from_train():
    rows = by_key(metrics_from_records(FIXTURE, group_by=("phase",)), "phase")
    assert set(rows) == {("train",), ("warmup",), (ALL,)}
    assert_metrics(rows[("warmup",)], {  # records 1, 2, 6, 8
        "n": 4, "success_rate": 0.25, "partial_rate": 0.0, "timeout_rate": 0.0,
        "abnormal_termination_rate": 0.25, "truncated_rate": 0.25, "infra_error_rate": 0.25,
        "mean_reward": 0.3,                # (1+0+0+0.2) = 1.2 / 4
        "mean_turns": 2.75,                # (2+3+1+5) = 11 / 4
        "mean_tool_calls": 2.75,           # (2+3+1+5) = 11 / 4
        "tool_failure_rate": 3 / 11,       # (0+1+1+1) = 3 / 11
        "invalid_action_ratio": 3 / 11,    # (0+1+0+2) = 3 / 11
        "repeated_action_ratio": 4 / 11,   # (0+2+0+2) = 4 / 11
    })
    assert_metrics(rows[("train",)], {  # records 3, 4, 5, 7, 9, 10
        "n": 6, "success_rate": 0.5,       # 3, 7, 9
        "partial_rate": 1 / 6, "timeout_rate": 1 / 6,
        "abnormal_termination_rate": 0.0, "truncated_rate": 0.0, "infra_error_rate": 0.0,
        "mean_reward": 3.5 / 6,            # (1+0+0.5+1+1+0) = 3.5 / 6
        "mean_turns": 11 / 6,              # (2+4+1+2+2+0) = 11 / 6
        "mean_tool_calls": 1.5,            # (1+4+1+1+2+0) = 9 / 6
        "tool_failure_rate": 2 / 9,        # record 4's 2 failures / 9 calls
        "invalid_action_ratio": 1 / 11,    # record 7's 1 invalid / 11 turns
        "repeated_action_ratio": 3 / 11,   # (1+2+0+0+0+0) = 3 / 11
    })


def test_default_grouping_is_harness_task_type_phase_with_an_overall_row_last():
    rows = metrics_from_records(FIXTURE)
    keys = [(r["harness"], r["task_type"], r["phase"]) for r in rows]
    # seven combinations occur (terminal_like/search/warmup does not), sorted, then the overall row
    assert keys == [(T, "arith", "train"), (T, "arith", "warmup"), (T, "search", "train"),
                    (A, "arith", "train"), (A, "arith", "warmup"), (A, "search", "train"),
                    (A, "search", "warmup"), (ALL, ALL, ALL)]
    groups = by_key(rows, "harness", "task_type", "phase")
    assert_metrics(groups[(T, "arith", "warmup")], {  # records 1, 2
        "n": 2, "success_rate": 0.5, "partial_rate": 0.0, "mean_reward": 0.5,
        "mean_turns": 2.5, "mean_tool_calls": 2.5,   # 5 / 2 each
        "tool_failure_rate": 0.2,                    # 1 / 5
        "invalid_action_ratio": 0.2,                 # 1 / 5
        "repeated_action_ratio": 0.4,                # 2 / 5
    })
    assert_metrics(groups[(T, "search", "train")], {  # records 4, 5
        "n": 2, "success_rate": 0.0, "partial_rate": 0.5, "timeout_rate": 0.5, "mean_reward": 0.25,
        "mean_turns": 2.5, "mean_tool_calls": 2.5,
        "tool_failure_rate": 0.4,                    # 2 / 5
        "invalid_action_ratio": 0.0,
        "repeated_action_ratio": 0.4,                # 2 / 5
    })
    assert_metrics(groups[(A, "search", "train")], {  # records 9, 10
        "n": 2, "success_rate": 0.5, "mean_reward": 0.5, "mean_turns": 1.0, "mean_tool_calls": 1.0,
        "tool_failure_rate": 0.0, "invalid_action_ratio": 0.0,
        "repeated_action_ratio": 0.0,                # "Q A" differs from "q a" by case
    })
    assert groups[(ALL, ALL, ALL)]["n"] == 10


def test_every_row_carries_every_metric_in_metrics_order():
    row = metrics_from_records(FIXTURE)[0]
    assert list(row)[3:] == [m.key for m in METRICS]
    assert {m.kind for m in METRICS} == {"rate", "mean", "count"}


def test_ratios_are_none_without_tool_calls_or_turns():
    rows = metrics_from_records([traj(T, "arith", "train", "fail", 0.0, "fail", [], 0, 0)], group_by=())
    assert rows[0]["tool_failure_rate"] is None
    assert rows[0]["invalid_action_ratio"] is None and rows[0]["repeated_action_ratio"] is None
    assert rows[0]["success_rate"] == 0.0 and rows[0]["mean_turns"] == 0.0


def test_empty_table_gives_only_an_overall_row_of_nones():
    rows = compute_metrics(schema.to_full_table([]))
    assert rows == [{"harness": ALL, "task_type": ALL, "phase": ALL, "n": 0,
                     **{m.key: None for m in METRICS if m.key != "n"}}]


def test_table_without_steps_reports_no_repeated_action_ratio():
    table = schema.to_full_table([r.to_row() for r in FIXTURE]).drop_columns(["steps"])
    row = compute_metrics(table, group_by=())[0]
    assert row["repeated_action_ratio"] is None and row["mean_turns"] == pytest.approx(2.2)


def test_chunked_table_counts_repeats_per_trajectory():
    # the same fixture split into two record batches: repeats must stay with their own trajectory
    rows = [r.to_row() for r in FIXTURE]
    table = pa.concat_tables([schema.to_full_table(rows[:3]),
                              schema.to_full_table(rows[3:])])
    assert compute_metrics(table, group_by=())[0]["repeated_action_ratio"] == pytest.approx(7 / 22)


def test_unknown_group_key_and_missing_columns_are_usage_errors():
    with pytest.raises(MetricsError, match="'split'.*harness, task_type, phase"):
        metrics_from_records(FIXTURE, group_by=("split",))
    table = schema.to_full_table([r.to_row() for r in FIXTURE]).drop_columns(["outcome"])
    with pytest.raises(MetricsError, match="outcome"):
        compute_metrics(table)
