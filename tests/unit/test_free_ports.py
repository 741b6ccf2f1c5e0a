"""The tests' port allocator (`tests.conftest.free_ports`): ports below the kernel's ephemeral range, so
a port picked for a server is not handed to another socket before the server binds it."""

from __future__ import annotations

import socket

from tests import conftest
from tests.conftest import _ephemeral_low, _port_block, free_port, free_ports


def test_ports_come_from_this_workers_block_below_the_ephemeral_range_and_are_not_repeated():
    block = _port_block()
    assert len(block) >= 1000 and block.stop <= _ephemeral_low()
    got = [free_port() for _ in range(50)]
    assert len(set(got)) == 50 and all(p in block for p in got)


def test_a_port_in_use_is_skipped_and_n_consecutive_ports_are_all_free(monkeypatch):
    base = free_ports(8)  # eight free ports nobody else in this worker is handed now (the turn has moved past them)
    with socket.socket() as held:
        held.bind(("127.0.0.1", base + 2))
        monkeypatch.setattr(conftest, "_next_port", [base])
        again = free_ports(3)  # base..base+2 holds the taken port: the next three
        assert again == base + 3
        for p in range(again, again + 3):
            with socket.socket() as s:
                s.bind(("127.0.0.1", p))


def test_the_blocks_of_two_workers_do_not_overlap(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    a = _port_block()
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    b = _port_block()
    assert a.stop <= b.start and len(a) == len(b) > 0
