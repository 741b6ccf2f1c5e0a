"""The threads harness code runs in (`RolloutController.executor`): a thread pool that grows by one
thread for each call abandoned past `rollout.step_timeout_seconds`. Python cannot stop a thread, so
an abandoned call keeps its thread until the harness returns (its instance is retired and closed,
which ends the call in a harness whose `close` stops its process or sandbox:
`episode_scaffold.lend`); without a thread in its place, `rollout.concurrency` hung calls would leave
no thread for any other episode and the run would stall.

Belongs here: the pool and its growth. Not here: the deadline (`episode_loop.env_caller`) or what
becomes of the instance (`controller.HarnessPool.retire`).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor


class HarnessThreads(ThreadPoolExecutor):
    def abandoned(self, calls: int = 1) -> None:
        """`calls` calls still hold their threads past their deadline: that many threads more, started
        now for the work queued behind them. CPython's pool starts a thread on submit only while its
        idle count says none is free, and that count still includes threads now stuck in a call, so
        it is emptied first (an undercount only starts a thread where one was idle, up to the maximum)."""
        with self._shutdown_lock:
            if self._shutdown:
                return
            self._max_workers += calls
            while self._idle_semaphore.acquire(timeout=0):
                pass
            for _ in range(calls):
                self._adjust_thread_count()
