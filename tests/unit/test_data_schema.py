"""The trajectory record's schema: rows validate without coercion, numpy numeric columns are
accepted by dtype, and a record survives the trip to an Arrow table and back unchanged."""

from __future__ import annotations

import datetime as dt

import numpy as np

from agentrl_cli.runtime.data.schema import (SCHEMA_VERSION, Artifact, StepRecord, ToolCallRecord, TrajectoryRecord, to_table,
                                     validate_row)


def record(**kw) -> TrajectoryRecord:
    return TrajectoryRecord(run_id="r", task_id="t", harness="h", harness_version="1",
                            steps=[StepRecord(0, "a", "o", tool_calls=[ToolCallRecord("x", "{}", "ok", 1.5, 0)])],
                            artifacts=[Artifact("s.py", "ab" * 32, "x")], reward_components={"outcome": 1.0}, **kw)


def test_a_conforming_row_has_no_errors():
    assert validate_row(record(token_ids=[1, 2], loss_mask=[0, 1], logprobs=[-0.5, -1]).to_row()) == []


def test_drift_is_named_by_path_and_never_coerced():
    row = record().to_row()
    row["turns"] = "5"
    row["steps"][0]["index"] = "0"
    row["steps"][0]["tool_calls"][0]["retries"] = 2 ** 40
    row["steps"][0]["reward"] = True
    row["steps"][0]["extra"] = 1
    row["token_ids"] = [1, "2"]
    row["started_at"] = dt.datetime(2026, 1, 1)  # naive
    errors = validate_row(row)
    for fragment in ("turns: expected int32, got str", "steps[0].index: expected int32, got str",
                     "steps[0].tool_calls[0].retries: expected int32, got int 1099511627776",
                     "steps[0].reward: expected double, got bool", "steps[0].extra: not in the schema",
                     "token_ids[1]: expected int32, got str", "started_at: expected timestamp"):
        assert any(fragment in e for e in errors), (fragment, errors)


def test_required_fields_and_versions():
    row = record().to_row()
    row.update(run_id=None, schema_version=SCHEMA_VERSION + 1, outcome="won")
    errors = validate_row(row)
    assert any(e.startswith("run_id: null") for e in errors)
    assert any("not the supported version" in e for e in errors) and any("outcome: 'won'" in e for e in errors)


def test_numpy_numeric_columns_are_checked_by_dtype():
    ok = record(token_ids=np.arange(5, dtype=np.int32), loss_mask=np.ones(5, np.int8), logprobs=np.zeros(5, np.float32))
    assert validate_row(ok.to_row()) == []
    bad = record(token_ids=np.zeros(3, dtype=np.float64)).to_row()
    assert any("token_ids: expected numbers for int32, got float64" in e for e in validate_row(bad))
    wide = record(token_ids=np.array([1, 2 ** 40])).to_row()
    assert any("token_ids: values outside int32" in e for e in validate_row(wide))


def test_training_arrays_are_stored_as_bytes_of_the_declared_dtype():
    from agentrl_cli.runtime.data.schema import FILE_SCHEMA, decode_arrays

    table = to_table([record(token_ids=[7, 8, 9], logprobs=np.array([-0.5], np.float64)).to_row()])
    assert FILE_SCHEMA.field("token_ids").metadata[b"dtype"] == b"<i4"
    assert table.column("token_ids")[0].as_py() == np.array([7, 8, 9], "<i4").tobytes()
    [ids] = decode_arrays(table.column("token_ids"), "token_ids")
    [lps] = decode_arrays(table.column("logprobs"), "logprobs")
    assert ids.tolist() == [7, 8, 9] and lps.dtype == np.float32 and lps.tolist() == [-0.5]


def test_round_trip_through_arrow_is_exact():
    rec = record(token_ids=np.arange(4, dtype=np.int32), loss_mask=np.array([0, 0, 1, 1], np.int8),
                 logprobs=np.array([-0.25, -0.5, 0.0, -1.0], np.float32), flags=["tamper"])
    row = to_table([rec.to_row()]).to_pylist()[0]
    back = TrajectoryRecord.from_row({**row, "harness": "h", "date": rec.date})
    assert back.token_ids == [0, 1, 2, 3] and back.loss_mask == [0, 0, 1, 1] and back.logprobs == [-0.25, -0.5, 0.0, -1.0]
    back.token_ids, back.loss_mask, back.logprobs = rec.token_ids.tolist(), rec.loss_mask.tolist(), rec.logprobs.tolist()
    rec.token_ids, rec.loss_mask, rec.logprobs = back.token_ids, back.loss_mask, back.logprobs
    assert back == rec
