"""A warm pool of sandboxes: pre-spawned, handed out fast, destroyed and respawned after use.

`acquire()` takes a warm sandbox when one is ready (microseconds) or waits, first come first
served, for the next one started (milliseconds), within `max_concurrency` sandboxes alive at once. `release()` never cleans a sandbox in place: it
destroys it and starts a replacement in the background. A reaper reclaims sandboxes held past
`lease_timeout_s`. `metrics()` counts what the pool created and destroyed and what it may have
leaked (processes left in destroyed sandboxes' cgroups, this process's fds, leftover directories).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

from agentrl_cli.core.errors import AgentrlError
from agentrl_cli.envs.sandbox.sandbox import Sandbox, SandboxSettings

log = logging.getLogger("agentrl.sandbox.pool")


class PoolExhausted(AgentrlError):
    """No sandbox could be had within the deadline."""


@dataclass
class _Lease:
    sandbox: Sandbox
    since: float


class SandboxPool:
    def __init__(self, settings: SandboxSettings | None = None, size: int = 8, max_concurrency: int = 64,
                 lease_timeout_s: float = 600.0, workers: int = 4) -> None:
        self.settings = settings or SandboxSettings()
        self.size = min(size, max_concurrency)
        self.max_concurrency = max_concurrency
        self.lease_timeout_s = lease_timeout_s
        self._cv = threading.Condition()
        self._warm: deque[Sandbox] = deque()
        self._waiters: deque[Future] = deque()  # FIFO: the oldest waiter gets the next sandbox
        self._leases: dict[str, _Lease] = {}
        self._live = 0  # warm + leased + starting + being destroyed: never above max_concurrency
        self._starting = 0
        self._closed = False
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sandbox-pool")
        self.counters = {"created": 0, "destroyed": 0, "acquired": 0, "warm_hits": 0, "reclaimed": 0,
                         "spawn_failures": 0, "leaked_processes": 0, "in_use_peak": 0}
        self._baseline_fds = _count_fds()
        self._reaper = threading.Thread(target=self._reap, name="sandbox-reaper", daemon=True)
        self._reaper.start()
        with self._cv:
            self._schedule_spawns()

    # -- public -------------------------------------------------------------------------------------
    def acquire(self, timeout: float = 60.0) -> Sandbox:
        """A sandbox for one episode: warm if one is ready, else the next one started (first come, first served)."""
        with self._cv:
            if self._closed:
                raise PoolExhausted("the sandbox pool is closed", "create a new pool")
            if self._warm and not self._waiters:
                sb = self._warm.popleft()
                self.counters["warm_hits"] += 1
                self._schedule_spawns()
                return self._lease(sb)
            fut: Future = Future()
            self._waiters.append(fut)
            self._schedule_spawns()
        try:
            sb = fut.result(timeout=timeout)
        except FutureTimeout:
            with self._cv:
                if fut in self._waiters:
                    self._waiters.remove(fut)
                    raise PoolExhausted(f"no sandbox free within {timeout:.0f} s ({self.max_concurrency} alive at most)",
                                        "raise sandbox.max_concurrency or lower rollout.concurrency") from None
            sb = fut.result()  # delivered just as the wait ran out
        with self._cv:
            return self._lease(sb)

    def release(self, sandbox: Sandbox) -> None:
        """Give a sandbox back: it is destroyed and a fresh one is started to replace it."""
        with self._cv:
            lease = self._leases.pop(sandbox.id, None)
        if lease is not None:  # else already reclaimed
            self._executor.submit(self._destroy, sandbox)

    def lease(self, timeout: float = 60.0) -> "_LeaseContext":
        return _LeaseContext(self, timeout)

    def metrics(self) -> dict:
        with self._cv:
            state = {"warm": len(self._warm), "in_use": len(self._leases), "pending": self._starting,
                     "waiting": len(self._waiters), "alive": self._live}
        return {**self.counters, **state, "open_fds": _count_fds(), "open_fds_delta": _count_fds() - self._baseline_fds,
                "sandbox_dirs": count_dirs(self.settings.root_dir)}

    def close(self) -> dict:
        """Destroy every sandbox; returns the final metrics (leaks included)."""
        with self._cv:
            self._closed = True
            for fut in self._waiters:
                fut.cancel()
            self._waiters.clear()
        self._executor.shutdown(wait=True)
        with self._cv:
            doomed = list(self._warm) + [lease.sandbox for lease in self._leases.values()]
            self._warm.clear()
            self._leases.clear()
        for sb in doomed:
            self._destroy(sb)
        return self.metrics()

    def __enter__(self) -> "SandboxPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals (call the *_locked ones holding self._cv) -----------------------------------------
    def _lease(self, sb: Sandbox) -> Sandbox:
        self._leases[sb.id] = _Lease(sb, time.monotonic())
        self.counters["acquired"] += 1
        self.counters["in_use_peak"] = max(self.counters["in_use_peak"], len(self._leases))  # episodes holding one at once
        return sb

    def _schedule_spawns(self) -> None:
        wanted = len(self._waiters) + max(0, self.size - len(self._warm)) - self._starting
        while wanted > 0 and self._live < self.max_concurrency and not self._closed:
            self._live += 1
            self._starting += 1
            wanted -= 1
            self._executor.submit(self._spawn_and_deliver)

    def _spawn_and_deliver(self) -> None:
        try:
            sb = Sandbox(self.settings)
        except Exception as exc:  # noqa: BLE001
            log.warning("sandbox failed to start: %s", exc)
            with self._cv:
                self.counters["spawn_failures"] += 1
                self._live -= 1
                self._starting -= 1
                while self._waiters:  # tell the oldest waiter instead of letting it time out
                    fut = self._waiters.popleft()
                    if fut.set_running_or_notify_cancel():
                        fut.set_exception(exc)
                        break
            return
        with self._cv:
            self.counters["created"] += 1
            self._starting -= 1
            while self._waiters:
                fut = self._waiters.popleft()
                if fut.set_running_or_notify_cancel():
                    fut.set_result(sb)
                    return
            if not self._closed:
                self._warm.append(sb)
                return
        self._destroy(sb)

    def _destroy(self, sb: Sandbox) -> None:
        cgroup = sb.cgroup
        sb.close()
        with self._cv:
            if cgroup is not None:
                self.counters["leaked_processes"] += len(cgroup.pids())
            self.counters["destroyed"] += 1
            self._live -= 1
            self._schedule_spawns()

    def _reap(self) -> None:
        while not self._closed:
            time.sleep(min(1.0, self.lease_timeout_s / 4))
            now = time.monotonic()
            with self._cv:
                stale = [lid for lid, lease in self._leases.items() if now - lease.since > self.lease_timeout_s]
                victims = [self._leases.pop(lid).sandbox for lid in stale]
                self.counters["reclaimed"] += len(victims)
            for sb in victims:
                log.warning("reclaiming sandbox %s held longer than %.0f s", sb.id, self.lease_timeout_s)
                try:
                    self._executor.submit(self._destroy, sb)
                except RuntimeError:  # the pool is closing
                    self._destroy(sb)


class _LeaseContext:
    def __init__(self, pool: SandboxPool, timeout: float) -> None:
        self.pool, self.timeout, self.sandbox = pool, timeout, None

    def __enter__(self) -> Sandbox:
        self.sandbox = self.pool.acquire(self.timeout)
        return self.sandbox

    def __exit__(self, *exc) -> None:
        self.pool.release(self.sandbox)


def _count_fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return -1


def count_dirs(root) -> int:
    try:
        return sum(1 for p in root.iterdir() if p.is_dir() and not p.name.startswith("support-"))
    except OSError:
        return 0
