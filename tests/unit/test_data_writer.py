"""The writer's fast path: records go to Arrow column by column; a record whose nested values have
the wrong type is found when its file is built, quarantined, and the others are still written."""

from __future__ import annotations

import json

import numpy as np

from agentrl_cli.runtime.data.schema import StepRecord, ToolCallRecord, TrajectoryRecord
from agentrl_cli.runtime.data.local_store import LocalStore
from agentrl_cli.runtime.data.writer import TrajectoryWriter, read_records


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


# ---- writing ahead: full chunks are encoded while rows still arrive -------------------------------------

def _staged(store) -> list:
    return sorted(store.staging_dir.glob("*.parquet.tmp")) if store.staging_dir.exists() else []


def test_full_chunks_are_encoded_ahead_and_published_only_at_the_flush(tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    from agentrl_cli.runtime.data import writer as writer_module

    monkeypatch.setattr(writer_module, "CHUNK_ROWS", 4)
    store = LocalStore(tmp_path / "s")
    w = TrajectoryWriter(store, rows_per_file=100, quarantine_dir=tmp_path / "q")
    bad = rec(5)
    bad.steps[0].index = "zero"  # found when its chunk is built ahead: quarantined once, not re-tried
    for i in range(10):
        assert w.write(bad if i == 5 else rec(i)) is True
    [tmp] = _staged(store)
    assert tmp.stat().st_size > 0  # two row groups on their way to disk
    assert store.list() == [] and w.buffered == 9 and w.stats["quarantined"] == 1
    w.close()
    assert _staged(store) == [] and w.buffered == 0
    [item] = store.list()
    assert pq.ParquetFile(store.root / item.key).metadata.num_row_groups == 3  # 4 + 3 kept + the last 2
    assert [r.task_id for r in read_records(store)] == [f"t{i}" for i in range(10) if i != 5]
    lines = (tmp_path / "q" / "quarantine.jsonl").read_text().splitlines()
    assert [json.loads(x)["row"]["task_id"] for x in lines] == ["t5"]


def test_a_failed_write_ahead_keeps_the_rows_and_the_flush_starts_afresh(tmp_path, monkeypatch):
    import errno

    import pyarrow as pa

    from agentrl_cli.runtime.data import parquet_file
    from agentrl_cli.runtime.data import writer as writer_module

    monkeypatch.setattr(writer_module, "CHUNK_ROWS", 4)
    real_encode, failures = parquet_file.RowGroupFile._encode, []

    def encode_fails_once(self, table: pa.Table) -> None:
        if not failures:
            failures.append(table.num_rows)
            raise OSError(errno.EIO, "injected write error")
        real_encode(self, table)

    monkeypatch.setattr(parquet_file.RowGroupFile, "_encode", encode_fails_once)
    store = LocalStore(tmp_path / "s")
    w = TrajectoryWriter(store, rows_per_file=100)
    for i in range(12):
        assert w.write(rec(i)) is True  # the error surfaces at the second chunk, and is not the caller's
    assert failures == [4] and _staged(store) == [] and w.buffered == 12
    w.close()
    assert [r.task_id for r in read_records(store)] == [f"t{i}" for i in range(12)]
    assert w.stats["rows_written"] == 12 and _staged(store) == []


def test_timestamps_keep_their_milliseconds_and_a_naive_step_time_is_quarantined(tmp_path):
    import datetime as dt

    utc = dt.timezone.utc
    times = [dt.datetime(2024, 5, 1, 10, 0, 0, 123999, tzinfo=utc), dt.datetime(1969, 12, 31, 23, 59, 59, 999500, tzinfo=utc),
             dt.datetime(2026, 1, 2, 3, 4, 5, 6000, tzinfo=dt.timezone(dt.timedelta(hours=-7))),
             dt.datetime(2400, 1, 1, 0, 0, 0, 1000, tzinfo=utc)]  # past float64's exact microseconds: Arrow's path
    store = LocalStore(tmp_path / "s")
    records = []
    for i, t in enumerate(times):
        r = rec(i, started_at=times[0], ended_at=t)
        r.steps[0].started_at = r.steps[0].ended_at = t
        records.append(r)
    naive = rec(9)
    naive.steps[0].started_at = dt.datetime(2024, 5, 1, 10, 0)  # no tzinfo: refused, not read as UTC
    with TrajectoryWriter(store, quarantine_dir=tmp_path / "q") as w:
        assert all(w.write(r) for r in [*records, naive])
    back = sorted(read_records(store), key=lambda r: r.task_id)
    floor_ms = [t.replace(microsecond=t.microsecond // 1000 * 1000).astimezone(utc) for t in times]
    assert [r.ended_at for r in back] == floor_ms and [r.steps[0].started_at for r in back] == floor_ms
    assert w.stats["quarantined"] == 1
    [line] = (tmp_path / "q" / "quarantine.jsonl").read_text().splitlines()
    assert json.loads(line)["row"]["task_id"] == "t9" and "steps[0].started_at" in line
