"""Every wait of a run has a deadline: a peer on 127.0.0.1 that accepts and never answers (or a step
that never returns) ends in a named error after the configured timeout, naming the key, instead of a
hang. The weight sync over disk to a silent server is in test_sync_deadline.py; the store's in
test_deadline_store.py.

- a distributed weight sync whose server never joins the group (training.weight_sync_timeout_s);
- a call to trainer ranks that never answer (training.rank_timeout_s): a hang, which the run restarts from;
- a checkpoint write that never finishes (training.checkpoint_timeout_s);
- a reward call to a service that never answers (reward.timeout_s): masked, never a wait or a zero score.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import threading
from multiprocessing.connection import Client, Listener
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from agentrl_cli.engines.inference.client import InferenceClient
from agentrl_cli.run.loop.checkpoints import CheckpointSchedule, CheckpointTimeout
from agentrl_cli.run.loop.restarts import crash_cause
from agentrl_cli.run.parts import RunParts, RunState
from agentrl_cli.runtime.reward.client import HttpRewardClient
from agentrl_cli.learner.checkpoint import CheckpointManager
from agentrl_cli.learner.ranks_backend import RanksBackend, TrainerRanksFailed
from agentrl_cli.weightsync.base import Prepared, WeightSyncError
from agentrl_cli.weightsync.distributed import DistributedTransport
from tests.integration.test_reward import _answer_request
from tests.integration.test_sync_deadline import silent_server

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


class SilentPeer:
    """A TCP listener on 127.0.0.1 that accepts and never writes a byte (for synchronous clients)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                self.held.append(self.sock.accept()[0])
            except OSError:
                return

    def close(self) -> None:
        self.sock.close()
        for c in self.held:
            c.close()


def test_a_distributed_sync_whose_server_never_joins_fails_within_its_deadline_naming_the_key():
    async def go():
        async with silent_server() as url:
            client = InferenceClient([url], timeout_s=1.0, max_retries=0)
            transport = DistributedTransport(client, backend="gloo", timeout_s=1.0)
            try:
                with pytest.raises(WeightSyncError) as err:
                    await transport.publish(Prepared(version=1, payload={"w": torch.zeros(4)}, rank=0))
            finally:
                await client.close()
            return err.value, transport

    error, transport = asyncio.run(go())
    assert "within 1 s (training.weight_sync_timeout_s)" in error.message
    assert "1 of 2 ranks joined" in error.message  # the trainer's own wait ended it, not the HTTP call's longer one
    assert transport.group is None and transport.groups_opened == 0


def test_a_distributed_transport_takes_its_deadline_from_the_config():
    cfg = SimpleNamespace(training=SimpleNamespace(weight_sync_timeout_s=7.5),
                          inference=SimpleNamespace(engine="hf", tp_size=1))
    assert DistributedTransport.from_config(cfg, client=None, workdir=Path(".")).timeout_s == 7.5


@pytest.fixture
def silent_ranks(tmp_path):
    """A RanksBackend whose launcher runs and whose rank 0 takes commands and never answers: the
    channel is a listener here, the launcher a process that only sleeps."""
    key = b"k" * 32
    listener = Listener(("127.0.0.1", 0), authkey=key)
    accepted: list = []
    thread = threading.Thread(target=lambda: accepted.append(listener.accept()), daemon=True)
    thread.start()
    backend = object.__new__(RanksBackend)
    backend.world_size, backend.rank_timeout_s = 2, 0.5
    backend.run_dir, backend.control = tmp_path, tmp_path / "trainer-ranks"
    backend.log_path = tmp_path / "trainer-ranks.log"
    backend.log_path.write_text("the launcher started its ranks\n")
    backend._proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    backend._conn = Client(listener.address, authkey=key)
    backend._failure, backend._step, backend.pids, backend.hosts, backend._names = None, 0, [], [], None
    backend._lock = threading.Lock()
    thread.join(5)
    yield backend
    backend._proc.kill()
    backend._proc.wait()
    for conn in accepted:
        conn.close()
    listener.close()


def test_a_train_step_the_ranks_never_answer_is_a_hang_naming_the_key(silent_ranks):
    with pytest.raises(TrainerRanksFailed) as err:
        silent_ranks.train_step([object()])
    assert "did not answer train_step within 0.5 s (training.rank_timeout_s)" in err.value.message
    assert "raise training.rank_timeout_s" in err.value.hint
    assert crash_cause(err.value) == "hang"  # the run restarts from its latest checkpoint
    assert silent_ranks._proc.poll() is not None  # the hung launcher was stopped
    with pytest.raises(TrainerRanksFailed):  # and the backend stays failed
        silent_ranks.save_checkpoint(Path("x"), {})


class StuckBackend:
    """A trainer whose checkpoint save never returns (storage that stopped answering)."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def save_checkpoint(self, directory: Path, state: dict) -> None:
        self.release.wait(30)


def test_a_checkpoint_write_that_never_finishes_raises_checkpoint_timeout_naming_the_key(tmp_path):
    backend = StuckBackend()
    parts = RunParts(backend=backend, checkpoints=CheckpointManager(tmp_path / "checkpoints", 2), run_id="r")
    state = RunState()
    training = SimpleNamespace(checkpoint_interval_steps=1, checkpoint_timeout_s=0.5)
    schedule = CheckpointSchedule(parts, state, training, overlap=False)
    try:
        with pytest.raises(CheckpointTimeout) as err:
            asyncio.run(schedule._write({"step": 3, "version": 1, "ledger": []}))  # returns though the write hangs
        assert "step 3 was not written within 0.5 s (training.checkpoint_timeout_s)" in err.value.message
        assert state.checkpoints_written == [] and parts.checkpoints.latest() is None
    finally:
        backend.release.set()


def test_a_reward_call_to_a_service_that_never_answers_is_masked_naming_the_deadline():
    peer = SilentPeer()
    try:
        client = HttpRewardClient(peer.url, timeout_s=0.5, max_retries=1, backoff_s=0.01)
        result = client.score(_answer_request())
    finally:
        peer.close()
    assert result.status == "infra_error" and result.masked and result.reward == 0.0
    assert "reward_service_unreachable" in result.flags
    assert "no answer within 0.5 s (reward.timeout_s + 5 s for the trip)" in result.detail
    [outage] = client.outages
    assert outage["failures"] == 2 and outage["end"] is None  # both attempts failed; it never answered
