"""Sandbox benchmark: warm-pool acquire, in-sandbox exec vs a bare subprocess (ratio measured side
by side), cold start, and throughput at 64 concurrent episodes. Targets (issue 3): warm acquire
p50 < 5 ms; in-sandbox exec <= 1.5x bare; zero failures at 64 concurrent. Then the host root and
an image root side by side (issue 47): warm acquire and first exec (`ls /` in a
sandbox just acquired) from two warm pools, alternately; target: an image root's warm acquire at
most 1.2x the host root's. The image: `--image REF`, else a tiny one made here from the host's
sh, cat and ls (unpacked into a temporary cache).

    python benchmarks/sandbox.py [--json] [--n 100] [--image oci:PATH:TAG] [--roots-only]
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
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


def roots_side_by_side(host: SandboxSettings, image: SandboxSettings, n: int) -> dict[str, tuple[list[float], list[float]]]:
    """root -> (warm acquire latencies, first exec latencies): a warm pool of each, acquired from
    alternately so both see the same machine load."""
    argv = ["ls", "/"]
    out: dict[str, tuple[list[float], list[float]]] = {"host": ([], []), "image": ([], [])}
    with SandboxPool(host, size=8, max_concurrency=32) as host_pool, SandboxPool(image, size=8, max_concurrency=32) as image_pool:
        pools = {"host": host_pool, "image": image_pool}
        for _ in range(n):
            for name, pool in pools.items():
                _wait(lambda: pool.metrics()["warm"] > 0)
                t = time.perf_counter()
                sb = pool.acquire()
                out[name][0].append(time.perf_counter() - t)
                t = time.perf_counter()
                r = sb.exec(argv)
                out[name][1].append(time.perf_counter() - t)
                assert r.exit_code == 0, r
                pool.release(sb)
        for name, pool in pools.items():
            assert pool.counters["warm_hits"] == pool.counters["acquired"] == n, (name, pool.counters)
    return out


def cold_side_by_side(roots: dict[str, SandboxSettings], n: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {name: [] for name in roots}
    for _ in range(n):
        for name, settings in roots.items():
            out[name] += cold_start(settings, 1)
    return out


def image_settings(settings: SandboxSettings, image: str, scratch: Path) -> SandboxSettings:
    """`settings` rooted in `image` (unpacked into the default image cache, kept as a run keeps it),
    or in a tiny image made and unpacked under `scratch` when `image` is ''."""
    if image:
        return settings.with_image(image)
    from tests.image_layouts import tiny_image

    image = f"oci:{tiny_image(scratch / 'tiny-layout')}:tiny"
    return replace(settings, image_cache_dir=scratch / "cache").with_image(image)


def root_figures(host: SandboxSettings, image: SandboxSettings, n: int) -> dict[str, dict]:
    runs = roots_side_by_side(host, image, n)
    (host_acq, host_exec), (img_acq, img_exec) = runs["host"], runs["image"]
    ratio = median(img_acq) / median(host_acq)
    return {
        "host_root_warm_acquire_p50": figure(median(host_acq) * 1e3, "ms"),
        "image_root_warm_acquire_p50": figure(median(img_acq) * 1e3, "ms"),
        "image_vs_host_warm_acquire": figure(ratio, "x", "<= 1.2", ratio <= 1.2),
        "host_root_first_exec_p50": figure(median(host_exec) * 1e3, "ms"),
        "image_root_first_exec_p50": figure(median(img_exec) * 1e3, "ms"),
        "image_vs_host_first_exec": figure(median(img_exec) / median(host_exec), "x"),
        # what a pool hides: starting one sandbox of each root (alternately), not judged
        **{f"{name}_root_cold_start_p50": figure(median(lat) * 1e3, "ms")
           for name, lat in cold_side_by_side({"host": host, "image": image}, max(10, n // 4)).items()},
        "image_root_digest": {"value": image.image_digest, "unit": f"digest of {image.image}", "target": None, "met": None},
    }


def main() -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=100, help="samples per latency figure")
    p.add_argument("--episodes", type=int, default=1000, help="sandbox starts in the 64-concurrent churn")
    p.add_argument("--image", default="", help="the image root to compare with the host root (default: a tiny image made here)")
    p.add_argument("--roots-only", action="store_true", help="only the host root vs image root figures")
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="agentrl-bench-"))
    os.chmod(root, 0o711)  # the sandbox user binds the support files from below it
    settings = SandboxSettings(root_dir=root)
    scratch = Path(tempfile.mkdtemp(prefix="agentrl-bench-images-"))
    os.chmod(scratch, 0o711)
    try:
        roots = root_figures(settings, image_settings(settings, args.image, scratch), args.n)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if args.roots_only:
        return report(roots, args.json)
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
        **roots,
    }
    return report(figures, args.json)


if __name__ == "__main__":
    sys.exit(main())
