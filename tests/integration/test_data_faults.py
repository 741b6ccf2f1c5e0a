"""The trajectory store under faults (docs/security.md rows 25, 26, 30): a writer SIGKILLed mid-file, a
full disk, and an unreachable or failing S3 endpoint. Network peers are on 127.0.0.1 only."""

from __future__ import annotations

import datetime as dt
import errno
import http.server
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import boto3
import pyarrow.parquet as pq
import pytest
from moto.server import ThreadedMotoServer

from agentrl_cli.runtime.data.gc import remove_stale_temp_files
from agentrl_cli.runtime.data.s3 import S3Store
from agentrl_cli.runtime.data.schema import TrajectoryRecord
from agentrl_cli.runtime.data.local_store import LocalStore
from agentrl_cli.runtime.data.writer import TrajectoryWriter, WriteError, check_parquet, read_records
from tests.conftest import free_port

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def _record(i: int, harness: str = "terminal_like", observation: str = "") -> TrajectoryRecord:
    t0 = dt.datetime(2024, 5, 1, 10, 0, 0, 123000, tzinfo=dt.timezone.utc) + dt.timedelta(seconds=i)
    return TrajectoryRecord(run_id="run-f", task_id=f"task-{i}", harness=harness, harness_version="1", seed=i,
                            initial_observation=observation or f"task {i}", outcome="success",
                            token_ids=[1, 2, i], started_at=t0, ended_at=t0)


def _wait_for(predicate, seconds: float):
    """Poll until predicate() is truthy or the deadline passes; returns its last value."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.001)
    return predicate()


def _assert_every_published_file_is_complete(store: LocalStore, rows_per_file: int) -> int:
    infos = store.list()
    for info in infos:
        assert info.key.endswith(".parquet") and ".tmp" not in info.key
        path = store.root / info.key
        with pq.ParquetFile(path) as pf:  # raises on a missing or torn footer
            assert pf.metadata.num_rows == rows_per_file
        check_parquet(path, rows_per_file)
    return len(infos)


# ---- row 25: SIGKILL during a Parquet write --------------------------------------------------------

_KILLED_WRITER = textwrap.dedent("""
    import datetime as dt, os, sys
    from agentrl_cli.runtime.data.schema import TrajectoryRecord
    from agentrl_cli.runtime.data.local_store import LocalStore
    from agentrl_cli.runtime.data.writer import TrajectoryWriter

    root, rows = sys.argv[1], int(sys.argv[2])
    writer = TrajectoryWriter(LocalStore(root), rows_per_file=rows)
    t0 = dt.datetime(2024, 5, 1, tzinfo=dt.timezone.utc)
    records = [TrajectoryRecord(run_id="big", task_id=f"t{i}", harness="big", harness_version="1",
                                initial_observation=os.urandom(4000).hex(), started_at=t0, ended_at=t0)
               for i in range(rows)]
    while True:  # one large file per pass, until the test kills us
        for record in records:
            writer.write(record)
""")


def _temp_files(store: LocalStore) -> list[Path]:
    return sorted(store.staging_dir.glob("*.tmp")) if store.staging_dir.is_dir() else []


def _half_written(store: LocalStore) -> bool:
    for path in _temp_files(store):
        try:
            if path.stat().st_size > 0:
                return True
        except FileNotFoundError:  # published meanwhile
            pass
    return False


def test_sigkill_mid_write_never_leaves_a_torn_file_under_a_final_name(tmp_path):
    store, rows = LocalStore(tmp_path / "data"), 400
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for attempt in range(20):
        proc = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, str(store.root), str(rows)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            # kill once a file has been published and the next one is half-written
            mid_write = _wait_for(lambda: proc.poll() is not None or (store.list() and _half_written(store)), 120)
            assert proc.poll() is None, f"writer exited early: {proc.stderr.read().decode()[-2000:]}"
            assert mid_write
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.kill()
            proc.wait(timeout=30)
            proc.stderr.close()
        assert proc.returncode == -signal.SIGKILL
        if _temp_files(store):
            break  # killed while a file was being written: the case under test
    else:
        pytest.fail("the writer was never caught mid-file in 20 tries")

    published = _assert_every_published_file_is_complete(store, rows)
    assert published >= 1
    assert store.read_table().num_rows == published * rows
    # the store is still usable: a new writer publishes and everything reads back
    with TrajectoryWriter(store, rows_per_file=10) as writer:
        writer.write(_record(1, harness="after"))
    assert [r.task_id for r in read_records(store) if r.harness == "after"] == ["task-1"]
    # the orphaned temp file is never listed, and retention can clear it
    leftovers = _temp_files(store)
    assert leftovers and not any(".tmp" in i.key for i in store.list())
    later = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=2)
    assert remove_stale_temp_files(store, now=later) == [str(p) for p in leftovers]
    assert _temp_files(store) == []


# ---- row 26: disk full -----------------------------------------------------------------------------

@pytest.fixture
def tiny_fs(tmp_path):
    """A 256 KiB tmpfs (needs root); unmounted afterwards."""
    mount_point = tmp_path / "tiny"
    mount_point.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a size-limited tmpfs needs root (run as root to test ENOSPC)")
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount_point)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"mount -t tmpfs was refused: {result.stderr.strip() or result.returncode}")
    yield mount_point
    subprocess.run(["umount", str(mount_point)], capture_output=True)


def test_disk_full_surfaces_enospc_removes_the_temp_file_and_keeps_rows_buffered(tiny_fs):
    store = LocalStore(tiny_fs / "data")
    writer = TrajectoryWriter(store, rows_per_file=10_000)
    small = [_record(i) for i in range(5)]
    for record in small:
        writer.write(record)
    writer.flush()  # this one fits
    [first] = store.list()

    big = [_record(100 + i, observation=os.urandom(3000).hex()) for i in range(200)]  # ~600 KB after zstd
    for record in big:
        assert writer.write(record) is True
    with pytest.raises(WriteError) as failure:
        writer.flush()
    assert failure.value.errno == errno.ENOSPC
    assert "ENOSPC" in str(failure.value) and "still buffered" in str(failure.value)
    assert _temp_files(store) == []
    assert [i.key for i in store.list()] == [first.key]
    check_parquet(store.root / first.key, 5)
    assert writer.buffered == 200 and writer.stats["rows_written"] == 5

    # nothing was lost: with room again, the same writer publishes the buffered rows
    grown = subprocess.run(["mount", "-o", "remount,size=8m", str(tiny_fs)], capture_output=True, text=True)
    if grown.returncode != 0:
        pytest.skip(f"remounting the tmpfs larger was refused: {grown.stderr.strip()}")
    writer.close()
    assert writer.buffered == 0
    assert sorted(r.seed for r in read_records(store)) == [r.seed for r in small + big]


# ---- row 30: object store unreachable ----------------------------------------------------------------

@pytest.fixture
def moto_later(aws_env):
    """A loopback port with nothing listening, and `start()` to bring moto up on it later."""
    servers: list[ThreadedMotoServer] = []

    class Endpoint:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        bucket = f"spool-{uuid.uuid4().hex[:12]}"

        def start(self) -> None:
            server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
            server.start()
            servers.append(server)
            boto3.client("s3", endpoint_url=self.url, region_name="us-east-1").create_bucket(Bucket=self.bucket)

    yield Endpoint()
    for server in servers:
        server.stop()


def _s3_store(tmp_path, endpoint: str, bucket: str, delays: list[float]) -> S3Store:
    return S3Store(bucket, "trajectories", endpoint_url=endpoint, spool_dir=tmp_path / "data" / "spool",
                   staging_dir=tmp_path / "data" / ".tmp", attempts=4, base_delay=0.01, max_delay=0.03,
                   connect_timeout=2, read_timeout=5, sleep=delays.append)


def test_unreachable_s3_spools_after_bounded_retries_and_upload_spool_delivers_everything(tmp_path, moto_later):
    delays: list[float] = []
    store = _s3_store(tmp_path, moto_later.url, moto_later.bucket, delays)
    records = [_record(i, harness=f"h{i % 3}") for i in range(6)]
    with TrajectoryWriter(store, rows_per_file=2) as writer:
        assert all(writer.write(r) for r in records)  # each harness fills a file: 3 publishes

    assert writer.stats["spooled"] == 3 and writer.stats["files"] == 3 and writer.stats["rows_written"] == 6
    assert delays == [0.01, 0.02, 0.03] * 3  # 4 attempts each, exponential, capped at max_delay
    assert store.stats["retries"] == 9 and store.stats["published"] == 0
    spooled = store.spool.list()
    assert len(spooled) == 3
    for info in spooled:
        check_parquet(store.spool.root / info.key, 2)

    moto_later.start()
    report = store.upload_spool()
    assert sorted(report["uploaded"]) == sorted(i.key for i in spooled)
    assert report["conflicts"] == [] and report["remaining"] == [] and report["error"] is None
    assert store.spool.list() == []
    assert sorted(read_records(store), key=lambda r: r.seed) == records


def test_the_next_publish_uploads_earlier_spooled_files_first(tmp_path, moto_later):
    store = _s3_store(tmp_path, moto_later.url, moto_later.bucket, [])
    with TrajectoryWriter(store, rows_per_file=1) as writer:
        writer.write(_record(0))
        assert writer.stats["spooled"] == 1
        moto_later.start()
        writer.write(_record(1))
    assert writer.stats["spooled"] == 1 and store.stats["published"] == 1
    assert store.stats["uploaded_from_spool"] == 1 and store.spool.list() == []
    assert sorted(r.seed for r in read_records(store)) == [0, 1]


def test_a_spooled_file_whose_key_now_exists_remotely_is_reported_and_kept_not_overwritten(tmp_path, moto_later):
    store = _s3_store(tmp_path, moto_later.url, moto_later.bucket, [])
    with TrajectoryWriter(store, rows_per_file=1) as writer:
        writer.write(_record(0))
        writer.write(_record(1, harness="other"))
    [clash, same] = sorted(store.spool.list(), key=lambda i: "other" in i.key)
    moto_later.start()
    client = boto3.client("s3", endpoint_url=moto_later.url, region_name="us-east-1")
    client.put_object(Bucket=moto_later.bucket, Key=f"trajectories/{clash.key}", Body=b"someone else's bytes")
    same_bytes = (store.spool.root / same.key).read_bytes()  # as if an earlier put's answer was lost
    client.put_object(Bucket=moto_later.bucket, Key=f"trajectories/{same.key}", Body=same_bytes)

    report = store.upload_spool()
    assert report["conflicts"] == [clash.key] and report["already_present"] == [same.key]
    assert store.get_bytes(clash.key) == b"someone else's bytes"
    kept = store.conflicts.root / clash.key
    check_parquet(kept, 1)  # our rows are still on disk, outside the upload queue
    assert store.spool.list() == [] and store.stats["spool_conflicts"] == 1


class _Always503(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # answers `Expect: 100-continue`, so botocore does not stall
    requests: list[str] = []

    def _fail(self) -> None:
        type(self).requests.append(f"{self.command} {self.path}")
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        body = b"<Error><Code>ServiceUnavailable</Code><Message>down for a test</Message></Error>"
        self.send_response(503)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = _fail

    def log_message(self, *args) -> None:
        pass


def test_an_endpoint_answering_5xx_is_retried_a_bounded_number_of_times_then_spooled(tmp_path, aws_env):
    _Always503.requests = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Always503)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        delays: list[float] = []
        store = _s3_store(tmp_path, f"http://127.0.0.1:{server.server_address[1]}", "bkt", delays)
        writer = TrajectoryWriter(store, rows_per_file=1)
        writer.write(_record(0))
        puts = [r for r in _Always503.requests if r.startswith("PUT ")]
        assert len(puts) == 4 and len(_Always503.requests) == 4  # exactly `attempts` tries, nothing else
        writer.close()  # a flush tries the spool once more
    finally:
        server.shutdown()
        thread.join(timeout=10)
        server.server_close()
    assert len(_Always503.requests) == 5 and _Always503.requests[-1].startswith("PUT ")
    assert delays == [0.01, 0.02, 0.03]
    assert writer.stats["spooled"] == 1 and len(store.spool.list()) == 1


def test_disk_full_while_writing_ahead_loses_nothing_and_the_flush_reports_enospc(tiny_fs):
    store = LocalStore(tiny_fs / "data")
    writer = TrajectoryWriter(store, rows_per_file=10_000)
    big = [_record(i, observation=os.urandom(3000).hex()) for i in range(600)]  # chunks of 256 fill the disk
    for record in big:
        assert writer.write(record) is True  # writing ahead fails quietly: the rows wait for the flush
    assert _temp_files(store) == [] and writer.buffered == 600
    with pytest.raises(WriteError) as failure:
        writer.flush()
    assert failure.value.errno == errno.ENOSPC and "still buffered" in str(failure.value)
    assert _temp_files(store) == [] and store.list() == [] and writer.buffered == 600

    grown = subprocess.run(["mount", "-o", "remount,size=16m", str(tiny_fs)], capture_output=True, text=True)
    if grown.returncode != 0:
        pytest.skip(f"remounting the tmpfs larger was refused: {grown.stderr.strip()}")
    writer.close()
    assert writer.buffered == 0
    assert sorted(r.seed for r in read_records(store)) == list(range(600))
