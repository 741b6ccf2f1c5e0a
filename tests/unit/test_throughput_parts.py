"""Small parts of the per-sample cost work: the CPU thread split between trainer and embedded
server, the buffer's count of still-trainable episodes, and the TRL benchmark's clean skip."""

from __future__ import annotations

import sys

from agentrl_cli.config import load_config
from agentrl_cli.engines.inference import launcher
from agentrl_cli.runtime.rollout.buffer import Episode, TrajectoryBuffer


def _cfg(*sets: str):
    return load_config(None, list(sets), env={}).config


def test_auto_threads_split_the_cores_between_trainer_and_embedded_server(monkeypatch):
    monkeypatch.setattr(launcher, "host_cores", lambda: 2)
    assert launcher.cpu_thread_split(_cfg()) == (1, 1)
    monkeypatch.setattr(launcher, "host_cores", lambda: 16)
    assert launcher.cpu_thread_split(_cfg()) == (8, 8)
    assert launcher.cpu_thread_split(_cfg("inference.replicas=3")) == (4, 4)
    # servers elsewhere: the trainer has the host to itself
    assert launcher.cpu_thread_split(_cfg('inference.urls=["http://127.0.0.1:1"]')) == (16, 16)
    # servers with no trainer beside them (stage 4, `agentrl serve`): the cores are theirs
    assert launcher.cpu_thread_split(_cfg(), trainer_here=False)[1] == 16
    assert launcher.cpu_thread_split(_cfg("inference.replicas=2"), trainer_here=False)[1] == 8


def test_configured_threads_win_over_auto(monkeypatch):
    monkeypatch.setattr(launcher, "host_cores", lambda: 2)
    assert launcher.cpu_thread_split(_cfg("training.cpu_threads=2", "inference.cpu_threads=3")) == (2, 3)
    assert launcher.thread_env(3) == {"OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "3"}


def test_buffer_counts_complete_and_filling_groups_as_usable():
    async def go():
        buf = TrajectoryBuffer(capacity=16, max_staleness=1, group_size=2)
        for gid, n in (("done", 2), ("filling", 1), ("broken", 1)):
            for _ in range(n):
                await buf.put(Episode(gid, record=None, version=0, reward=1.0))
        return buf
    import asyncio

    buf = asyncio.run(go())
    assert len(buf) == 4
    assert buf.usable({"filling"}) == 3  # "broken" lost its other member: it can never be trained


def test_peer_benchmark_says_when_trl_is_missing(monkeypatch):
    from benchmarks import peer_trl

    monkeypatch.setitem(sys.modules, "trl", None)  # import trl raises ImportError
    message = peer_trl.trl_available()
    assert message is not None and "bench" in message and "TRL is not installed" in message
