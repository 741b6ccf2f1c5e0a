"""Store writes have deadlines and lose nothing in an outage, on 127.0.0.1 only.

- a publish that never returns ends the flush in `StoreTimeout` naming data.write_timeout_s, and the
  writer refuses further work;
- an S3 endpoint that accepts and never answers: the put gives up after its bounded attempts and the
  file is spooled, the outage recorded;
- S3 unreachable for a while (a closed gate in front of moto): the file is spooled, a resumed run
  reading the store finds it there before it is uploaded, and the next flush uploads it: in the
  store once, not twice;
- a resumed run reads what it may reuse when it resumes: a draw drawn again later reuses its stored
  trajectory though the store has become unreachable (else the draw would be lost).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import uuid
from pathlib import Path
from types import SimpleNamespace

import boto3
import pytest

from agentrl_cli.acceptance.chaos.gate import Gate
from agentrl_cli.runtime.data.local_store import LocalStore
from agentrl_cli.runtime.data.s3 import S3Store
from agentrl_cli.runtime.data.schema import TrajectoryRecord
from agentrl_cli.runtime.data.writer import StoreTimeout, TrajectoryWriter, read_records
from agentrl_cli.run.loop.checkpoints import reuse_stored
from agentrl_cli.run.parts import RunParts, RunState
from agentrl_cli.runtime.rollout.buffer import TrajectoryBuffer
from tests.integration.test_deadlines import SilentPeer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def _record(i: int) -> TrajectoryRecord:
    t0 = dt.datetime(2024, 5, 1, 10, 0, 0, tzinfo=dt.timezone.utc) + dt.timedelta(seconds=i)
    return TrajectoryRecord(run_id="run-d", task_id=f"task-{i}", harness="terminal_like", harness_version="1", seed=i,
                            initial_observation=f"task {i}", outcome="success", token_ids=[1, 2, i], started_at=t0,
                            ended_at=t0)


class HangingStore(LocalStore):
    """A local store whose publish never returns until released (a file system that stopped answering)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.release = threading.Event()

    def publish(self, local_path: Path, key: str) -> str:
        self.release.wait(30)
        return super().publish(local_path, key)


def test_a_publish_that_never_returns_ends_in_store_timeout_naming_the_key(tmp_path):
    store = HangingStore(tmp_path / "store")
    writer = TrajectoryWriter(store, rows_per_file=100, write_timeout_s=0.5)
    try:
        assert writer.write(_record(1))
        with pytest.raises(StoreTimeout) as err:
            writer.flush()
        assert "did not finish flushing 1 trajectories within 0.5 s (data.write_timeout_s)" in err.value.message
        with pytest.raises(StoreTimeout):  # the stuck publish may still run: the writer takes nothing more
            writer.write(_record(2))
    finally:
        store.release.set()


def test_an_s3_put_to_an_endpoint_that_never_answers_is_spooled_within_its_deadline(tmp_path, aws_env):
    peer = SilentPeer()
    try:
        store = S3Store("b-silent", "t", endpoint_url=peer.url, spool_dir=tmp_path / "spool", staging_dir=tmp_path / ".tmp",
                        attempts=2, base_delay=0.01, connect_timeout=1, read_timeout=0.5)
        with TrajectoryWriter(store, rows_per_file=1) as writer:
            writer.write(_record(1))
    finally:
        peer.close()
    assert writer.stats["spooled"] == 1 and store.spooled() == 1
    [outage] = store.outages
    assert outage["failures"] >= 2 and outage["end"] is None and outage["drained"] is None


@pytest.fixture
def gated_s3(aws_env, moto_endpoint):
    """A bucket on moto's server, reached through a gate the test can close."""
    bucket = f"gate-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    gate = Gate(int(moto_endpoint.rsplit(":", 1)[1])).start()
    yield gate, bucket
    gate.stop()


def test_a_file_spooled_in_an_outage_is_read_back_then_uploaded_once(tmp_path, gated_s3):
    gate, bucket = gated_s3
    store = S3Store(bucket, "trajectories", endpoint_url=gate.url, spool_dir=tmp_path / "spool",
                    staging_dir=tmp_path / ".tmp", attempts=2, base_delay=0.01, connect_timeout=1, read_timeout=5)
    writer = TrajectoryWriter(store, rows_per_file=1, write_timeout_s=30)
    assert writer.write(_record(1))  # reachable: published
    gate.close()
    assert writer.write(_record(2))  # unreachable: spooled
    assert writer.stats["spooled"] == 1 and store.spooled() == 1
    gate.open()

    assert sorted(r.task_id for r in read_records(store)) == ["task-1", "task-2"]  # the spooled one counts as stored
    writer.close()  # the flush uploads the spool
    assert store.spooled() == 0 and store.stats["uploaded_from_spool"] == 1
    assert sorted(r.task_id for r in read_records(store)) == ["task-1", "task-2"]  # once each
    [outage] = store.outages
    assert outage["start"] <= outage["end"] <= outage["drained"]


def test_a_resumed_run_reuses_its_stored_trajectories_while_the_store_is_unreachable(tmp_path, gated_s3):
    gate, bucket = gated_s3
    store = S3Store(bucket, "trajectories", endpoint_url=gate.url, spool_dir=tmp_path / "spool",
                    staging_dir=tmp_path / ".tmp", attempts=1, connect_timeout=1, read_timeout=5)
    records = [TrajectoryRecord(**{**_record(i).__dict__, "run_id": "r", "phase": "train", "group_id": f"g0-000000{i // 2}",
                                   "trajectory_id": f"r-train-g0-000000{i // 2}-{i % 2}"}) for i in range(6)]
    with TrajectoryWriter(store, rows_per_file=10) as writer:
        for r in records:
            writer.write(r)
    buffer = TrajectoryBuffer(8, 2, 2)
    ledger = [{"step": 1, "draws": [{"group_id": "g0-0000000", "harness": "terminal_like", "task_id": "task-0", "episodes": 2}]}]
    run = RunParts(run_id="r", phase="train", buffer=buffer, writer=SimpleNamespace(store=store), controller=SimpleNamespace())
    asyncio.run(reuse_stored(run, RunState(ledger=ledger)))
    assert run.controller.stored_ids == {r.trajectory_id for r in records}

    gate.close()  # the store goes away after the resume
    again = run.controller.fetch("r-train-g0-0000002-1")  # a draw the crashed attempt stored, drawn again
    assert again is not None and again.task_id == "task-5" and again.token_ids == records[5].token_ids
