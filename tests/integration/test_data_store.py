"""The store contract: one suite that the local store and the S3 store (moto's server on 127.0.0.1)
must both pass. Covers publish/list/get/delete, create-only keys (docs/security.md row 28), partitioned
reads, record round trips, schema drift quarantine (row 27), redaction on disk and in logs (row 29),
and retention."""

from __future__ import annotations

import datetime as dt
import io
import json
import logging
import threading
import uuid

import pyarrow.compute as pc
import pytest

from agentrl_cli.config.models import DataConfig, S3Config
from agentrl_cli.runtime.data.gc import collect_garbage, parse_age
from agentrl_cli.core.redact import Redactor, install_log_redaction
from agentrl_cli.runtime.data.s3 import S3Store
from agentrl_cli.runtime.data.schema import Artifact, StepRecord, ToolCallRecord, TrajectoryRecord
from agentrl_cli.runtime.data.local_store import LocalStore
from agentrl_cli.runtime.data.stores import open_store
from agentrl_cli.runtime.data.store import AlreadyExists, ObjectNotFound
from agentrl_cli.runtime.data.writer import TrajectoryWriter, find_trajectory, read_records

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("aws_env")]

AWS_KEY_ID = "AKIA" + "IOSFODNN7EXAMPLE"
GH_TOKEN = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
PEM = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----"
BEARER = "eyJhbGciOiJIUzI1NiJ9" + ".eyJzdWIiOiIxIn0.c2lnbmF0dXJlLXNpZ25hdHVyZQ"




@pytest.fixture
def store(data_config):
    return open_store(data_config)


def _staged(store, content: bytes):
    store.staging_dir.mkdir(parents=True, exist_ok=True)
    path = store.staging_dir / f"{uuid.uuid4().hex}.tmp"
    path.write_bytes(content)
    return path


def _record(i: int, harness: str = "terminal_like", day: str = "2024-05-01", **kw) -> TrajectoryRecord:
    t0 = dt.datetime.fromisoformat(f"{day}T10:00:00.123+00:00") + dt.timedelta(seconds=i)
    kw.setdefault("initial_observation", f"task {i}")
    return TrajectoryRecord(
        run_id="run-1", task_id=f"task-{i}", harness=harness, harness_version="1.0", task_type="arith", seed=i,
        final_answer=None if i % 3 == 0 else str(i),
        steps=[StepRecord(index=0, action="echo hi", observation="hi", started_at=t0, ended_at=t0,
                          tool_calls=[ToolCallRecord(name="shell", arguments='{"cmd": "echo hi"}', latency_ms=1.5)])],
        artifacts=[Artifact(path="out.txt", sha256="ab" * 32, content="hi"), Artifact(path="gone.txt", sha256=None)],
        reward=i / 4, reward_components={"tests": 1.0, "format": 0.5}, reward_status="ok", outcome="success",
        flags=["tamper"] if i == 1 else [], token_ids=[1, 2, i], loss_mask=[0, 1, 1], logprobs=[-0.5, -1.25, -2.0],
        started_at=t0, ended_at=t0 + dt.timedelta(seconds=2), **kw)


# ---- publish / list / get / delete -----------------------------------------------------------------

def test_store_url_names_its_kind(store, data_config):
    assert store.url.startswith("file://" if data_config.store == "local" else "s3://")


def test_publish_makes_an_object_listable_readable_and_deletable(store):
    path = _staged(store, b"parquet bytes")
    assert store.publish(path, "harness=h/date=2024-05-01/part-a.parquet") == "published"
    assert not path.exists()  # the store took the file
    [info] = store.list()
    assert (info.key, info.size) == ("harness=h/date=2024-05-01/part-a.parquet", len(b"parquet bytes"))
    assert info.modified.tzinfo is not None
    assert store.get_bytes(info.key) == b"parquet bytes"
    store.delete(info.key)
    assert store.list() == []
    with pytest.raises(ObjectNotFound):
        store.get_bytes(info.key)


def test_list_filters_by_prefix(store):
    for key in ("harness=a/date=2024-05-01/p1.parquet", "harness=b/date=2024-05-01/p2.parquet", "notes/x.txt"):
        store.publish(_staged(store, key.encode()), key)
    assert [i.key for i in store.list("harness=a/")] == ["harness=a/date=2024-05-01/p1.parquet"]
    assert sorted(i.key for i in store.list()) == ["harness=a/date=2024-05-01/p1.parquet",
                                                   "harness=b/date=2024-05-01/p2.parquet", "notes/x.txt"]


@pytest.mark.parametrize("key", ["../escape.parquet", "/abs/x.parquet", "a/../../x", ".tmp/x", "a//b", ""])
def test_publish_refuses_keys_that_could_leave_the_store(store, key):
    with pytest.raises(ValueError, match="invalid store key"):
        store.publish(_staged(store, b"x"), key)


def test_two_writers_publishing_one_key_only_the_first_succeeds_and_nothing_is_overwritten(data_config):
    writer_a, writer_b = open_store(data_config), open_store(data_config)  # independent clients
    key = "harness=h/date=2024-05-01/part-same.parquet"
    writer_a.publish(_staged(writer_a, b"first"), key)
    second = _staged(writer_b, b"second")
    with pytest.raises(AlreadyExists, match="already exists"):
        writer_b.publish(second, key)
    assert writer_a.get_bytes(key) == b"first"
    assert second.read_bytes() == b"second"  # the loser keeps its file
    assert [i.key for i in writer_b.list()] == [key]


def test_concurrent_local_publishers_of_one_key_exactly_one_wins(tmp_path):
    """The local store's guarantee is its own (a hard link); S3's is the server's If-None-Match."""
    for round_ in range(20):
        stores = [LocalStore(tmp_path / "data") for _ in range(4)]
        key = f"harness=h/date=2024-05-01/part-{round_}.parquet"
        paths = [_staged(s, f"writer {n}".encode()) for n, s in enumerate(stores)]
        barrier, outcomes = threading.Barrier(len(stores)), [None] * len(stores)

        def publish(n: int) -> None:
            barrier.wait()
            try:
                outcomes[n] = stores[n].publish(paths[n], key)
            except AlreadyExists:
                outcomes[n] = "exists"

        threads = [threading.Thread(target=publish, args=(n,)) for n in range(len(stores))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(outcomes) == ["exists"] * 3 + ["published"]
        winner = outcomes.index("published")
        assert stores[0].get_bytes(key) == f"writer {winner}".encode()


# ---- the writer through the store ------------------------------------------------------------------

def test_read_table_re_adds_partition_columns_and_applies_filters(store, tmp_path):
    with TrajectoryWriter(store, rows_per_file=2) as writer:
        for i in range(6):
            writer.write(_record(i, harness="alpha" if i < 4 else "beta", day="2024-05-01" if i % 2 else "2024-05-02"))
    assert writer.stats["rows_written"] == 6 and writer.stats["files"] == 4  # alpha×2 days ×2 rows, beta×2 days ×1
    table = store.read_table()
    assert table.num_rows == 6
    assert table.column_names[-2:] == ["harness", "date"]
    pairs = sorted(zip(table["harness"].to_pylist(), table["date"].to_pylist()))
    assert pairs == sorted(("alpha" if i < 4 else "beta", "2024-05-01" if i % 2 else "2024-05-02") for i in range(6))
    beta = store.read_table(pc.field("harness") == "beta")
    assert sorted(beta["task_id"].to_pylist()) == ["task-4", "task-5"]
    assert store.read_table((pc.field("date") == "2024-05-01") & (pc.field("seed") > 2)).num_rows == 2


def test_empty_store_reads_as_an_empty_table_with_the_schema(store):
    table = store.read_table()
    assert table.num_rows == 0 and "trajectory_id" in table.column_names and "harness" in table.column_names


def test_records_round_trip_unchanged(store):
    records = [_record(i, harness="alpha" if i % 2 else "beta") for i in range(7)]
    with TrajectoryWriter(store, rows_per_file=3) as writer:
        assert all(writer.write(r) for r in records)
    back = sorted(read_records(store), key=lambda r: r.seed)
    assert back == records
    assert find_trajectory(store, records[4].trajectory_id) == records[4]
    assert find_trajectory(store, "no-such-id") is None


def test_rows_stay_buffered_until_a_partition_fills_or_the_writer_flushes(store):
    writer = TrajectoryWriter(store, rows_per_file=3)
    writer.write(_record(0))
    writer.write(_record(1))
    assert store.list() == [] and writer.buffered == 2
    writer.write(_record(2))
    assert len(store.list()) == 1 and writer.buffered == 0
    writer.write(_record(3))
    writer.close()
    assert store.read_table().num_rows == 4 and writer.buffered == 0


def test_segment_starts_round_trip_and_files_written_before_them_read_as_one_segment(store, tmp_path):
    import dataclasses

    import pyarrow as pa
    import pyarrow.parquet as pq

    from agentrl_cli.runtime.data.schema import FILE_SCHEMA
    from agentrl_cli.runtime.data.columnar import records_table

    split = dataclasses.replace(_record(0), token_ids=[1, 2, 3, 4, 5], loss_mask=[0, 1, 0, 1, 1],
                                logprobs=[0.0, -1.0, 0.0, -0.5, -0.25], segment_starts=[0, 2])
    with TrajectoryWriter(store, quarantine_dir=tmp_path / "q") as writer:
        assert writer.write(split) is True
    # a file of the schema before segment_starts existed (the column absent), published beside it
    old = records_table([_record(1)])
    old = old.drop_columns(["segment_starts"])
    assert "segment_starts" not in old.schema.names and len(old.schema) == len(FILE_SCHEMA) - 1
    buf = io.BytesIO()
    pq.write_table(old, buf)
    store.publish(_staged(store, buf.getvalue()), "harness=terminal_like/date=2024-05-01/part-before.parquet")
    got = {r.task_id: r for r in read_records(store)}
    assert got["task-0"].segment_starts == [0, 2] and got["task-0"].token_ids == [1, 2, 3, 4, 5]
    assert got["task-1"].segment_starts == [] and got["task-1"].token_ids == [1, 2, 1]
    assert isinstance(store.read_table().column("segment_starts").type, type(pa.binary()))


def test_schema_drift_is_rejected_before_writing_and_quarantined(store, tmp_path):
    quarantine = tmp_path / "quarantine"
    good = _record(0)
    int_for_string = {**_record(1).to_row(), "task_id": 12345}
    string_for_int = {**_record(2).to_row(), "seed": "7"}
    unknown_column = {**_record(3).to_row(), "surprise": 1}
    with TrajectoryWriter(store, quarantine_dir=quarantine) as writer:
        assert writer.write(good) is True
        assert [writer.write(r) for r in (int_for_string, string_for_int, unknown_column)] == [False] * 3
    assert writer.stats["quarantined"] == 3 and writer.stats["rows_written"] == 1
    assert [r.trajectory_id for r in read_records(store)] == [good.trajectory_id]
    lines = [json.loads(line) for line in (quarantine / "quarantine.jsonl").read_text().splitlines()]
    assert [q["row"]["trajectory_id"] for q in lines] == [int_for_string["trajectory_id"],
                                                         string_for_int["trajectory_id"], unknown_column["trajectory_id"]]
    assert lines[0]["errors"] == ["task_id: expected string, got int 12345"]
    assert lines[1]["errors"] == ["seed: expected int64, got str '7'"]
    assert "surprise: not in the schema" in lines[2]["errors"][0]


def test_a_harness_name_that_would_change_the_path_is_quarantined(store, tmp_path):
    with TrajectoryWriter(store, quarantine_dir=tmp_path / "q") as writer:
        assert writer.write(_record(0, harness="../../etc")) is False
    assert store.list() == [] and writer.stats["quarantined"] == 1


@pytest.fixture
def agentrl_log():
    """Captures the `agentrl` logger tree; removes its handler and filters afterwards."""
    logger, stream = logging.getLogger("agentrl"), io.StringIO()
    handler = logging.StreamHandler(stream)
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    yield logger, stream
    logger.removeHandler(handler)
    logger.setLevel(old_level)
    for f in list(logger.filters):
        logger.removeFilter(f)


def test_secrets_are_redacted_in_parquet_files_and_logs(store, tmp_path, agentrl_log):
    logger, stream = agentrl_log
    redactor = Redactor()
    install_log_redaction(redactor, logger)
    leaky = _record(0, initial_observation=f"$ env\nAWS_ACCESS_KEY_ID={AWS_KEY_ID}")
    leaky.steps[0].observation = f"cloned with {GH_TOKEN}\n{PEM}"
    leaky.steps[0].tool_calls[0].arguments = json.dumps({"headers": {"Authorization": f"Bearer {BEARER}"}})
    drifted = {**_record(1).to_row(), "seed": f"{AWS_KEY_ID}"}
    with TrajectoryWriter(store, compression="none", redactor=redactor, quarantine_dir=tmp_path / "q") as writer:
        assert writer.write(leaky) is True
        assert writer.write(drifted) is False
    logging.getLogger("agentrl.harness").info("agent output: %s", leaky.steps[0].observation)

    [info] = store.list()
    raw = store.get_bytes(info.key)  # uncompressed, so plain text would be visible
    assert b"[REDACTED:aws_access_key]" in raw and b"[REDACTED:github_token]" in raw
    logs = stream.getvalue() + (tmp_path / "q" / "quarantine.jsonl").read_text()
    for secret in (AWS_KEY_ID, GH_TOKEN, "PRIVATE KEY", BEARER):
        assert secret.encode() not in raw
        assert secret not in logs
    assert "agent output: cloned with [REDACTED:github_token]\n[REDACTED:private_key]" in logs
    [back] = read_records(store)
    assert back.steps[0].tool_calls[0].arguments == '{"headers": {"Authorization": "Bearer [REDACTED:bearer_token]"}}'
    assert back.artifacts[0].sha256 == "ab" * 32 and back.trajectory_id == leaky.trajectory_id


# ---- retention -------------------------------------------------------------------------------------

def test_gc_deletes_only_partitions_that_ended_before_the_cutoff(store):
    with TrajectoryWriter(store) as writer:
        for i, day in enumerate(["2024-01-01", "2024-01-10", "2024-01-12", "2024-01-31"]):
            writer.write(_record(i, day=day))
    store.publish(_staged(store, b"x"), "harness=h/date=someday/part-x.parquet")
    store.publish(_staged(store, b"x"), "notes/readme.txt")
    now = dt.datetime(2024, 2, 1, 12, tzinfo=dt.timezone.utc)  # 20d → cutoff 2024-01-12 12:00

    preview = collect_garbage(store, "20d", now=now, dry_run=True)
    assert len(store.list()) == 6
    report = collect_garbage(store, dt.timedelta(days=20), now=now)
    assert preview["deleted"] == report["deleted"]
    assert sorted(k.split("/")[1] for k in report["deleted"]) == ["date=2024-01-01", "date=2024-01-10"]
    assert report["kept"] == 2 and report["bytes"] > 0
    assert sorted(s["key"] for s in report["skipped"]) == ["harness=h/date=someday/part-x.parquet", "notes/readme.txt"]
    assert sorted(i.key.split("/")[1] for i in store.list()) == ["date=2024-01-12", "date=2024-01-31",
                                                                  "date=someday", "readme.txt"]


@pytest.mark.parametrize("text, expected", [("30d", dt.timedelta(days=30)), ("12h", dt.timedelta(hours=12)),
                                            ("90m", dt.timedelta(minutes=90)), (" 7d ", dt.timedelta(days=7))])
def test_parse_age_reads_days_hours_and_minutes(text, expected):
    assert parse_age(text) == expected


@pytest.mark.parametrize("text", ["", "30", "d", "1.5d", "-3d", "0d", "3w", "30 days"])
def test_parse_age_rejects_anything_else_with_the_accepted_forms(text):
    with pytest.raises(ValueError, match="e.g. 30d, 12h, 90m"):
        parse_age(text)


def test_open_store_refuses_an_unknown_kind():
    class Bogus:
        store = "ftp"
    with pytest.raises(ValueError, match="data.store must be 'local' or 's3'"):
        open_store(Bogus())


def test_s3_store_is_built_from_config(tmp_path):
    config = DataConfig(store="s3", root=str(tmp_path / "d"), s3=S3Config(bucket="bkt", prefix="/p/"))
    s3 = open_store(config)
    assert isinstance(s3, S3Store) and s3.url == "s3://bkt/p"
    assert s3.spool.root == (tmp_path / "d" / "spool").absolute()
    assert s3.staging_dir == (tmp_path / "d" / ".tmp").absolute()
