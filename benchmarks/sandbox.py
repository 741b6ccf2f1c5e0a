"""Sandbox benchmark: warm-pool acquire, in-sandbox exec vs a bare subprocess (ratio measured side
by side), cold start, and throughput at 64 concurrent episodes. Targets (issue 3): warm acquire
p50 < 5 ms; in-sandbox exec <= 1.5x bare; zero failures at 64 concurrent.

    python benchmarks/sandbox.py [--json] [--n 100]
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrl_cli.envs.sandbox import Sandbox, SandboxPool, SandboxSettings  # noqa: E402
from benchmarks._common import figure, median, parser, percentile, report  # noqa: E402

PYTHON = "/usr/bin/python3"


def _wait(pred, seconds=60.0):
    end = time.monotonic() + seconds
    while time.monotonic() < end and not pred():
        time.sleep(0.005)


def warm_acquire(settings: SandboxSettings, n: int) -> list[float]:
    lat = []
    with SandboxPool(settings, size=8, max_concurrency=32) as pool:
        for _ in range(n):
            _wait(lambda: pool.metrics()["warm"] > 0)
            t = time.perf_counter()
            sb = pool.acquire()
            lat.append(time.perf_counter() - t)
            pool.release(sb)
    return lat


def exec_vs_bare(settings: SandboxSettings, n: int) -> tuple[list[float], list[float]]:
    bare, inside = [], []
    argv = [PYTHON, "-c", "pass"]
    with Sandbox(settings) as sb:
        sb.exec(argv)  # warm the page cache for both
        subprocess.run(argv, check=True)
        for _ in range(n):  # interleaved, so both see the same machine load
            t = time.perf_counter()
            subprocess.run(argv, check=True)
            bare.append(time.perf_counter() - t)
            t = time.perf_counter()
            r = sb.exec(argv)
            inside.append(time.perf_counter() - t)
            assert r.exit_code == 0, r
    return bare, inside


def cold_start(settings: SandboxSettings, n: int) -> list[float]:
    lat = []
    for _ in range(n):
        t = time.perf_counter()
        sb = Sandbox(settings)
        lat.append(time.perf_counter() - t)
        sb.close()
    return lat


def concurrent_throughput(settings: SandboxSettings, episodes: int, concurrency: int = 64) -> tuple[float, int, list[float], dict]:
    """`episodes` sandbox starts, `concurrency` at a time (docs/security.md row 14): rate, failures,
    per-episode acquire latencies and the pool's final leak counters."""
    failures, starts = [], []
    pool = SandboxPool(settings, size=16, max_concurrency=concurrency)
    try:
        def episode(i: int) -> None:
            try:
                t = time.perf_counter()
                sb = pool.acquire(timeout=120)
                starts.append(time.perf_counter() - t)
                try:
                    r = sb.exec(f"echo {i}")
                    if r.stdout.strip() != str(i):
                        failures.append(i)
                finally:
                    pool.release(sb)
            except Exception:  # noqa: BLE001 - counted
                failures.append(i)

        t = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as ex:
            list(ex.map(episode, range(episodes)))
        elapsed = time.perf_counter() - t
    finally:
        final = pool.close()
    return episodes / elapsed, len(failures), starts, final


def main() -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=100, help="samples per latency figure")
    p.add_argument("--episodes", type=int, default=1000, help="sandbox starts in the 64-concurrent churn")
    args = p.parse_args()
    settings = SandboxSettings(root_dir=Path(tempfile.mkdtemp(prefix="agentrl-bench-")))
    warm = warm_acquire(settings, args.n)
    bare, inside = exec_vs_bare(settings, args.n)
    cold = cold_start(settings, max(10, args.n // 4))
    rate, failures, starts, final = concurrent_throughput(settings, episodes=args.episodes)
    leaks = final["leaked_processes"] + max(0, final["open_fds_delta"]) + final["sandbox_dirs"]
    ratio = median(inside) / median(bare)
    figures = {
        "warm_acquire_p50": figure(percentile(warm, 0.5) * 1e3, "ms", "< 5", percentile(warm, 0.5) * 1e3 < 5),
        "warm_acquire_p99": figure(percentile(warm, 0.99) * 1e3, "ms"),
        "bare_python_pass_p50": figure(median(bare) * 1e3, "ms"),
        "sandbox_python_pass_p50": figure(median(inside) * 1e3, "ms"),
        "sandbox_vs_bare_exec_ratio": figure(ratio, "x", "<= 1.5", ratio <= 1.5),
        "cold_start_p50": figure(percentile(cold, 0.5) * 1e3, "ms"),
        "cold_start_p99": figure(percentile(cold, 0.99) * 1e3, "ms"),
        "episodes_per_s_at_64_concurrent": figure(rate, "episodes/s"),
        "failures_at_64_concurrent": figure(failures, "episodes", "0", failures == 0),
        "start_p50_at_64_concurrent": figure(percentile(starts, 0.5) * 1e3, "ms"),
        "start_p99_at_64_concurrent": figure(percentile(starts, 0.99) * 1e3, "ms"),
        "leaks_after_churn": figure(leaks, "processes+fds+dirs", "0", leaks == 0),
    }
    return report(figures, args.json)


if __name__ == "__main__":
    sys.exit(main())
