"""Trajectory filters: every allowed form selects the right rows of a small hand-made table, and
every forbidden form is refused with a QueryError that names the problem."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from agentrl_cli.runtime.data import schema
from agentrl_cli.runtime.data.query import (COLUMNS, SUMMARY_COLUMNS, QueryError, filter_table, parse_filter,
                                    summary_rows)
from agentrl_cli.core.errors import UsageError

UTC = dt.timezone.utc
#       id   harness           outcome     reward turns calls fails started
ROWS = [("a", "terminal_like", "success", 1.0, 60, 10, 4, dt.datetime(2024, 5, 1, 9, tzinfo=UTC)),
        ("b", "terminal_like", "timeout", 0.0, 2, 5, 5, dt.datetime(2024, 5, 2, 9, tzinfo=UTC)),
        ("c", "tool_api_like", "error", 0.25, 51, 8, 1, dt.datetime(2024, 5, 3, 9, tzinfo=UTC)),
        ("d", "tool_api_like", "partial", 0.5, 3, 0, 0, dt.datetime(2024, 5, 4, 9, tzinfo=UTC)),
        ("e", "terminal_like", "fail", -0.5, 52, 9, 3, dt.datetime(2024, 5, 5, 9, tzinfo=UTC))]


@pytest.fixture
def table() -> pa.Table:
    rows = [schema.TrajectoryRecord(run_id="r", task_id=f"task-{i}", harness=h, harness_version="1",
                                    outcome=o, reward=rw, turns=t, tool_calls=c, tool_failures=f,
                                    started_at=s, ended_at=s, trajectory_id=i).to_row()
            for i, h, o, rw, t, c, f, s in ROWS]
    return schema.to_full_table(rows)


def ids(table: pa.Table, text: str) -> list[str]:
    return filter_table(table, text).column("trajectory_id").to_pylist()


@pytest.mark.parametrize("text, expected", [
    ("tool_failures > 3 and turns > 50", ["a"]),
    ("harness == 'terminal_like' and outcome != 'success'", ["b", "e"]),
    ("reward >= 0.5 or not (turns < 3)", ["a", "c", "d", "e"]),
    ("outcome in ('timeout', 'error')", ["b", "c"]),
    ("outcome not in ['timeout', 'error']", ["a", "d", "e"]),
    ("turns in (2, 3.0, 60.5)", ["b", "d"]),
    ("50 < turns <= 52", ["c", "e"]),
    ("3 < turns", ["a", "c", "e"]),
    ("reward < -0.25", ["e"]),
    ("reward == 1", ["a"]),
    ("tool_failures == tool_calls", ["b", "d"]),
    ("(turns > 50 or turns < 3) and not harness == 'tool_api_like'", ["a", "b", "e"]),
    ("date == '2024-05-03'", ["c"]),
    ("started_at >= '2024-05-04'", ["d", "e"]),
    ("started_at < '2024-05-02T09:00:00Z'", ["a"]),
    ("outcome in ()", []),
])
def test_allowed_forms_select_the_right_rows(table, text, expected):
    assert ids(table, text) == expected


def test_parse_filter_returns_an_arrow_expression_usable_elsewhere(table):
    expr = parse_filter("turns > 50")
    assert table.filter(expr).num_rows == 3


@pytest.mark.parametrize("text, fragments", [
    ("__import__('os')", ["function calls are not allowed", "__import__('os')"]),
    ("turns.real > 1", ["attribute access is not allowed", "turns.real"]),
    ("steps > 1", ["'steps' is a list column", "only scalar columns"]),
    ("turnz > 1", ["unknown column 'turnz'", "did you mean 'turns'"]),
    ("turns + 1 > 2", ["arithmetic is not allowed", "turns + 1"]),
    ("turns > 'x'", ["type mismatch", "turns is int32", "'x' is text"]),
    ("outcome == 3", ["type mismatch", "outcome is string"]),
    ("reward > True", ["type mismatch", "True is a boolean"]),
    ("outcome > turns", ["type mismatch", "outcome (string)", "turns (int32)"]),
    ("reward_components > 1", ["'reward_components' is a map column"]),
    ("turns", ["a column alone is not a condition"]),
    ("1 < 2", ["needs a column on at least one side"]),
    ("turns in 3", ["`in` needs a parenthesised list"]),
    ("3 in (1, 2)", ["`in` needs a column on its left"]),
    ("turns > (1, 2)", ["only allowed after `in`"]),
    ("turns == None", ["only text, numbers and True/False"]),
    ("harness is 'x'", ["`is` / `is not` are not allowed"]),
    ("turns[0] > 1", ["indexing is not allowed"]),
    ("-turns > 1", ["arithmetic is not allowed", "-turns"]),
    ("[t for t in turns]", ["ListComp expressions are not allowed"]),
    ("turns = 3", ["cannot parse the filter"]),
    ("started_at > 'yesterday'", ["'yesterday' is not a date/time"]),
    ("turns > true", ["unknown column 'true'", "did you mean True"]),
    ("   ", ["the filter is empty"]),
])
def test_forbidden_forms_raise_query_error_naming_the_problem(text, fragments):
    with pytest.raises(QueryError) as info:
        parse_filter(text)
    for fragment in fragments:
        assert fragment in info.value.message


def test_column_errors_list_the_allowed_columns():
    with pytest.raises(QueryError) as info:
        parse_filter("turnz > 1")
    message = info.value.message
    assert "Allowed columns:" in message and "tool_failures" in message and "harness" in message
    assert "steps" not in message.split("Allowed columns:")[1]


def test_query_error_is_a_value_error_and_a_usage_error():
    with pytest.raises(ValueError):
        parse_filter("steps > 1")
    with pytest.raises(UsageError):
        parse_filter("steps > 1")


def test_allowed_columns_are_the_scalar_columns_including_partitions():
    assert {"harness", "date", "turns", "reward", "outcome", "started_at"} <= set(COLUMNS)
    assert not {"steps", "flags", "reward_components", "token_ids", "artifacts"} & set(COLUMNS)


def test_filter_on_a_column_the_table_lacks_is_refused(table):
    with pytest.raises(QueryError, match="date"):
        filter_table(table.drop_columns(["date"]), "date == '2024-05-01'")


def test_summary_rows_are_a_compact_printable_projection(table):
    rows = summary_rows(filter_table(table, "outcome == 'timeout'"))
    assert rows == [{"trajectory_id": "b", "harness": "terminal_like", "task_id": "task-b",
                     "outcome": "timeout", "reward": 0.0, "turns": 2, "tool_calls": 5,
                     "tool_failures": 5, "started_at": "2024-05-02T09:00:00+00:00"}]
    assert list(rows[0]) == list(SUMMARY_COLUMNS)


def test_summary_rows_honour_columns_and_limit(table):
    rows = summary_rows(table.drop_columns(["harness"]), columns=("trajectory_id", "harness"), limit=2)
    assert rows == [{"trajectory_id": "a", "harness": None}, {"trajectory_id": "b", "harness": None}]
    with pytest.raises(QueryError, match="did you mean 'outcome'"):
        summary_rows(table, columns=("outcom",))
