"""The harness thread pool grows by a thread for each call abandoned past its deadline, so work
queued behind hung calls runs (rollout/harness_threads.py), even when the pool's idle count still
counts the threads that are now stuck."""

from __future__ import annotations

import threading
import time

from agentrl_cli.runtime.rollout.harness_threads import HarnessThreads


def test_work_queued_behind_two_hung_calls_runs_once_they_are_abandoned():
    pool, hang = HarnessThreads(max_workers=2), threading.Event()
    try:
        for f in [pool.submit(time.sleep, 0.001) for _ in range(6)]:  # earlier calls: the idle count runs ahead
            f.result(timeout=10)
        hung = [pool.submit(hang.wait, 60) for _ in range(2)]
        queued = pool.submit(lambda: "ran")
        assert not queued.done() and not any(f.done() for f in hung)
        pool.abandoned(2)
        assert queued.result(timeout=10) == "ran"
    finally:
        hang.set()
        pool.shutdown(wait=True)
