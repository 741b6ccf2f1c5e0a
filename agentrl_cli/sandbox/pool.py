"""A warm pool of sandboxes: pre-spawned, handed out fast, destroyed and respawned after use.

`acquire()` takes a warm sandbox when one is ready (microseconds) or starts one (milliseconds),
within `max_concurrency` sandboxes alive at once. `release()` never cleans a sandbox in place: it
destroys it and starts a replacement in the background. A reaper reclaims sandboxes held past
`lease_timeout_s`. `metrics()` counts what the pool created and destroyed and what it may have
leaked (processes left in destroyed sandboxes' cgroups, this process's fds, leftover directories).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from agentrl_cli.errors import AgentrlError
from agentrl_cli.sandbox.sandbox import Sandbox, SandboxSettings

log = logging.getLogger("agentrl.sandbox.pool")


class PoolExhausted(AgentrlError):
    """No sandbox could be had within the deadline."""


@dataclass
class _Lease:
    sandbox: Sandbox
    since: float


class SandboxPool:
    def __init__(self, settings: SandboxSettings | None = None, size: int = 8, max_concurrency: int = 64,
                 lease_timeout_s: float = 600.0, workers: int = 2) -> None:
        self.settings = settings or SandboxSettings()
        self.size = size
        self.max_concurrency = max_concurrency
        self.lease_timeout_s = lease_timeout_s
        self._warm: queue.SimpleQueue[Sandbox] = queue.SimpleQueue()
        self._slots = threading.BoundedSemaphore(max_concurrency)  # one per live sandbox
        self._leases: dict[str, _Lease] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sandbox-pool")
        self._pending = 0
        self.counters = {"created": 0, "destroyed": 0, "acquired": 0, "warm_hits": 0, "reclaimed": 0,
                         "spawn_failures": 0, "leaked_processes": 0}
        self._baseline_fds = _count_fds()
        self._reaper = threading.Thread(target=self._reap, name="sandbox-reaper", daemon=True)
        self._reaper.start()
        for _ in range(min(size, max_concurrency)):
            self._refill()

    # -- public -------------------------------------------------------------------------------------
    def acquire(self, timeout: float = 60.0) -> Sandbox:
        if self._closed:
            raise PoolExhausted("the sandbox pool is closed", "create a new pool")
        try:
            sb = self._warm.get_nowait()
            self.counters["warm_hits"] += 1
        except queue.Empty:
            if not self._slots.acquire(timeout=timeout):
                raise PoolExhausted(f"no sandbox free within {timeout:.0f} s ({self.max_concurrency} alive at most)",
                                    "raise sandbox.max_concurrency or lower rollout.concurrency") from None
            try:
                sb = self._spawn()
            except BaseException:
                self._slots.release()
                raise
        with self._lock:
            self._leases[sb.id] = _Lease(sb, time.monotonic())
            self.counters["acquired"] += 1
        return sb

    def release(self, sandbox: Sandbox) -> None:
        """Give a sandbox back: it is destroyed and a fresh one is started to replace it."""
        with self._lock:
            lease = self._leases.pop(sandbox.id, None)
        if lease is None:
            return  # already reclaimed
        self._executor.submit(self._destroy_and_refill, sandbox)

    def lease(self, timeout: float = 60.0) -> "_LeaseContext":
        return _LeaseContext(self, timeout)

    def metrics(self) -> dict:
        with self._lock:
            in_use = len(self._leases)
        return {**self.counters, "warm": self._warm.qsize(), "in_use": in_use, "pending": self._pending,
                "open_fds": _count_fds(), "open_fds_delta": _count_fds() - self._baseline_fds,
                "sandbox_dirs": _count_dirs(self.settings.root_dir)}

    def close(self) -> dict:
        """Destroy every sandbox; returns the final metrics (leaks included)."""
        self._closed = True
        self._executor.shutdown(wait=True)
        with self._lock:
            leased = [lease.sandbox for lease in self._leases.values()]
            self._leases.clear()
        while True:
            try:
                leased.append(self._warm.get_nowait())
            except queue.Empty:
                break
        for sb in leased:
            self._destroy(sb)
        return self.metrics()

    def __enter__(self) -> "SandboxPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals ----------------------------------------------------------------------------------
    def _spawn(self) -> Sandbox:
        try:
            sb = Sandbox(self.settings)
        except BaseException:
            self.counters["spawn_failures"] += 1
            raise
        self.counters["created"] += 1
        return sb

    def _destroy(self, sb: Sandbox) -> None:
        cgroup = sb.cgroup
        sb.close()
        if cgroup is not None:
            self.counters["leaked_processes"] += len(cgroup.pids())
        self.counters["destroyed"] += 1
        self._slots.release()

    def _destroy_and_refill(self, sb: Sandbox) -> None:
        try:
            self._destroy(sb)
        finally:
            if not self._closed:
                self._refill_now()

    def _refill(self) -> None:
        self._executor.submit(self._refill_now)

    def _refill_now(self) -> None:
        if self._closed or self._warm.qsize() >= self.size:
            return
        if not self._slots.acquire(blocking=False):
            return  # at the concurrency limit: acquire() will start one when a slot frees
        self._pending += 1
        try:
            sb = self._spawn()
        except Exception as exc:  # noqa: BLE001
            self._slots.release()
            log.warning("warm sandbox failed to start: %s", exc)
            return
        finally:
            self._pending -= 1
        if self._closed:
            self._destroy(sb)
        else:
            self._warm.put(sb)

    def _reap(self) -> None:
        while not self._closed:
            time.sleep(min(1.0, self.lease_timeout_s / 4))
            now = time.monotonic()
            with self._lock:
                stale = [lid for lid, lease in self._leases.items() if now - lease.since > self.lease_timeout_s]
                victims = [self._leases.pop(lid).sandbox for lid in stale]
            for sb in victims:
                log.warning("reclaiming sandbox %s held longer than %.0f s", sb.id, self.lease_timeout_s)
                self.counters["reclaimed"] += 1
                self._executor.submit(self._destroy_and_refill, sb)


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


def _count_dirs(root) -> int:
    try:
        return sum(1 for p in root.iterdir() if p.is_dir() and not p.name.startswith("support-"))
    except OSError:
        return 0
