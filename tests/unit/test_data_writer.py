"""The writer's fast path: records go to Arrow column by column; a record whose nested values have
the wrong type is found when its file is built, quarantined, and the others are still written."""

from __future__ import annotations

import json

import numpy as np

from agentrl_cli.data.schema import StepRecord, ToolCallRecord, TrajectoryRecord
from agentrl_cli.data.store import LocalStore
from agentrl_cli.data.writer import TrajectoryWriter, read_records


def rec(i: int, **kw) -> TrajectoryRecord:
    kw.setdefault("token_ids", np.arange(3, dtype=np.int32))
    return TrajectoryRecord(run_id="r", task_id=f"t{i}", harness="h", harness_version="1",
                            steps=[StepRecord(0, "a", "o", tool_calls=[ToolCallRecord("x")])], **kw)


def test_top_level_drift_is_refused_at_write(tmp_path):
    w = TrajectoryWriter(LocalStore(tmp_path / "s"), quarantine_dir=tmp_path / "q")
    assert w.write(rec(0, turns="5")) is False and w.stats["quarantined"] == 1 and w.buffered == 0


def test_nested_drift_is_quarantined_at_flush_and_the_rest_is_written(tmp_path):
    store = LocalStore(tmp_path / "s")
    bad = rec(1)
    bad.steps[0].index = "zero"
    wide = rec(2, token_ids=np.array([1, 2 ** 40], dtype=np.int64))
    with TrajectoryWriter(store, quarantine_dir=tmp_path / "q") as w:
        assert all(w.write(r) for r in (rec(0), bad, wide, rec(3)))
    assert sorted(r.task_id for r in read_records(store)) == ["t0", "t3"]
    lines = [json.loads(x) for x in (tmp_path / "q" / "quarantine.jsonl").read_text().splitlines()]
    assert [x["row"]["task_id"] for x in lines] == ["t1", "t2"] and w.stats["quarantined"] == 2
    assert any("steps[0].index" in e for e in lines[0]["errors"])


def test_float_token_ids_are_refused_not_truncated(tmp_path):
    store = LocalStore(tmp_path / "s")
    with TrajectoryWriter(store, quarantine_dir=tmp_path / "q") as w:
        w.write(rec(0, token_ids=[1, 2.5]))
        w.write(rec(1, token_ids=np.array([1.0, 2.0])))
        w.write(rec(2))
    assert [r.task_id for r in read_records(store)] == ["t2"] and w.stats["quarantined"] == 2
