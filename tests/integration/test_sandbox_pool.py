"""The warm pool: fast hand-out, destroy-and-respawn, concurrency limit, forced reclaim, and the
churn test (docs/security.md row 14): 1,000 episodes, 64 at a time, leave no process, fd or directory."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from agentrl_cli.envs.sandbox import PoolExhausted, Sandbox, SandboxPool, SandboxSettings
from tests.integration.conftest import needs_bwrap

pytestmark = [pytest.mark.integration, needs_bwrap]


def _wait(predicate, seconds: float = 30.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def _sandbox_processes() -> list[int]:
    """Processes in this process's sandboxes' cgroups (a sandbox's id starts with the pid that started it),
    not in those of other processes, such as a parallel pytest worker's (pytest -n)."""
    found = []
    mine = f"agentrl-sandbox/{os.getpid()}-"
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if mine in (entry / "cgroup").read_text():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def _sandbox_mounts(root: Path) -> list[str]:
    return [line for line in Path("/proc/self/mounts").read_text().splitlines() if str(root) in line]


def test_release_destroys_and_the_next_sandbox_starts_clean(sandbox_root):
    with SandboxPool(SandboxSettings(root_dir=sandbox_root), size=2, max_concurrency=4) as pool:
        assert _wait(lambda: pool.metrics()["warm"] == 2)
        first = pool.acquire()
        assert pool.metrics()["warm_hits"] == 1
        first.exec("echo leftover > state.txt; nohup sleep 1000 >/dev/null 2>&1 &")
        pids = first.processes()
        pool.release(first)
        assert _wait(lambda: not first.alive and not any(Path(f"/proc/{p}").exists() for p in pids))
        second = pool.acquire()
        assert second.id != first.id
        assert second.exec("cat state.txt").exit_code != 0
        pool.release(second)


def test_concurrency_limit_refuses_past_the_bound(sandbox_root):
    with SandboxPool(SandboxSettings(root_dir=sandbox_root), size=0, max_concurrency=2) as pool:
        a, b = pool.acquire(), pool.acquire()
        with pytest.raises(PoolExhausted) as info:
            pool.acquire(timeout=0.3)
        assert "sandbox.max_concurrency" in info.value.hint
        pool.release(a)
        c = pool.acquire(timeout=10)  # a freed slot is usable again
        pool.release(b)
        pool.release(c)


def test_stragglers_are_reclaimed_by_force(sandbox_root):
    with SandboxPool(SandboxSettings(root_dir=sandbox_root), size=0, max_concurrency=2, lease_timeout_s=0.3) as pool:
        held = pool.acquire()
        assert _wait(lambda: pool.metrics()["reclaimed"] == 1, seconds=10)
        assert _wait(lambda: not held.alive, seconds=10)
        pool.release(held)  # a late release of a reclaimed sandbox is harmless
        assert pool.metrics()["in_use"] == 0


def test_process_backend_is_an_explicit_unisolated_opt_out(sandbox_root):
    with Sandbox(SandboxSettings(backend="process", root_dir=sandbox_root)) as sb:
        assert sb.describe()["isolated"] is False
        r = sb.exec("echo hi > f.txt && cat f.txt && pwd")
        assert r.status == "ok" and r.stdout.splitlines()[0] == "hi"
        assert r.stdout.splitlines()[1] == str(sb.workdir)
        assert sb.exec("sleep 5", timeout=0.5).status == "timeout"


def test_churn_1000_episodes_64_at_a_time_leaks_nothing(sandbox_root):
    settings = SandboxSettings(root_dir=sandbox_root)
    pool = SandboxPool(settings, size=8, max_concurrency=64, workers=2)
    fds_before = len(os.listdir("/proc/self/fd"))
    failures = []

    def episode(i: int) -> None:
        sb = pool.acquire(timeout=120)
        try:
            r = sb.exec(f"echo $(( {i} * 3 )); sleep 0 & true")
            if r.stdout.strip() != str(i * 3):
                failures.append((i, r))
        finally:
            pool.release(sb)

    with ThreadPoolExecutor(max_workers=64) as ex:
        list(ex.map(episode, range(1000)))
    final = pool.close()
    assert failures == []
    assert final["acquired"] == 1000 and final["created"] == final["destroyed"] >= 1000
    assert final["leaked_processes"] == 0
    assert final["sandbox_dirs"] == 0
    assert _sandbox_processes() == []
    assert _sandbox_mounts(sandbox_root) == []
    assert len(os.listdir("/proc/self/fd")) <= fds_before
