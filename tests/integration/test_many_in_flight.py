"""Hundreds of episodes in flight at once through the real rollout controller: terminal_like episodes,
each in a bubblewrap sandbox of its own from the run's warm pools (`HarnessSandboxes`), every
generation sent to the embedded inference server (a random tiny model, in a thread of this process).

What is measured, not assumed: how many episodes held a sandbox at once (the pool's `in_use_peak`),
how many generation requests the server decoded in one batch, this process's peak RSS during the
rollout (the server included: it runs in this process) and the sandboxes' (their own processes),
and the wall time. All are printed (`pytest -s`) and attached to the test's report (`record_property`).
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from transformers import AutoConfig, AutoTokenizer

from agentrl_cli.config import load_config
from agentrl_cli.config.buffer_budget import episode_bytes
from agentrl_cli.core.serving import ServerThread
from agentrl_cli.engines.inference.client import InferenceClient
from agentrl_cli.engines.inference.engine import HFEngine
from agentrl_cli.engines.inference.hf_server import create_app
from agentrl_cli.envs.sandbox.provider import HarnessSandboxes
from agentrl_cli.runtime.data.local_store import LocalStore
from agentrl_cli.runtime.data.writer import TrajectoryWriter, read_records
from agentrl_cli.runtime.reward.client import LocalRewardClient
from agentrl_cli.runtime.reward.scorer import Scorer
from agentrl_cli.runtime.rollout.buffer import TrajectoryBuffer
from agentrl_cli.runtime.rollout.controller import RolloutController
from agentrl_cli.runtime.rollout.sampler import TaskSampler
from harnesses.registry import create
from harnesses.tasks import load_tasks
from tests.integration.conftest import needs_bwrap

pytestmark = [pytest.mark.integration, needs_bwrap]

MB = 2**20
GROUP = 4
HEADROOM_MB = 256  # threads' stacks (64 harness workers, the pool's), allocator slack, sandbox bookkeeping


def held_bytes(obj, seen: set | None = None) -> int:
    """Bytes one held object takes in this process, everything it refers to counted once (numpy
    arrays by their buffers)."""
    seen = set() if seen is None else seen
    if id(obj) in seen or obj is None or isinstance(obj, (bool, type)):
        return 0
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        return sys.getsizeof(obj) + (obj.nbytes if obj.base is None else 0)
    size = sys.getsizeof(obj)
    if isinstance(obj, dict):
        return size + sum(held_bytes(k, seen) + held_bytes(v, seen) for k, v in obj.items())
    if isinstance(obj, (list, tuple, set, frozenset)):
        return size + sum(held_bytes(v, seen) for v in obj)
    if hasattr(obj, "__dict__"):
        return size + held_bytes(vars(obj), seen)
    return size


class MemoryPeak:
    """This process's RSS peak from now on (the kernel's high-water mark, reset through clear_refs
    where the kernel allows it, else sampled) and the largest sum of its child processes' RSS, sampled."""

    def __init__(self, interval_s: float = 0.25) -> None:
        self.me = psutil.Process()
        self.start_rss = self.me.memory_info().rss
        self.exact = _reset_high_water_mark()
        self.peak_rss = self.start_rss
        self.peak_children = 0
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="rss-sampler", daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak_rss = max(self.peak_rss, self.me.memory_info().rss)
            total = 0
            for child in self.me.children(recursive=True):
                try:
                    total += child.memory_info().rss
                except psutil.Error:  # ended meanwhile
                    pass
            self.peak_children = max(self.peak_children, total)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        if self.exact:
            self.peak_rss = max(self.peak_rss, _high_water_mark())


def _reset_high_water_mark() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # 5: reset the peak RSS (VmHWM) to the current RSS
        return True
    except OSError:
        return False


def _high_water_mark() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def _rollout(random_model_dir, tmp_path, sandbox_root, episodes: int) -> dict:
    """`episodes` terminal_like episodes, all allowed in flight at once, one model turn each."""
    sandbox_root.chmod(0o711)  # the run's directory goes below it, and the sandbox user binds from there
    cfg = load_config(None, [
        f"rollout.concurrency={episodes}", f"rollout.buffer_size={episodes}", f"rollout.group_size={GROUP}",
        "rollout.max_steps_per_trajectory=1", "inference.max_new_tokens=8",
        f"sandbox.max_concurrency={episodes}", f"sandbox.pool_size={episodes}", f"sandbox.root_dir={sandbox_root}",
        'harnesses=[{"name": "terminal_like"}]'], env={}).config
    # one batch holds every episode's turn: it starts when the last one arrives (the window, restarted by
    # each arrival, only bounds how long stragglers are waited for: 8 windows)
    engine = HFEngine(random_model_dir, max_batch_size=episodes, batch_window_ms=1000, weight_version="1")
    server = ServerThread(create_app(engine), name="hf").start()
    sandboxes = HarnessSandboxes(cfg)
    provider = sandboxes.for_harness("terminal_like")
    pool = provider.inner
    writer = TrajectoryWriter(LocalStore(tmp_path / "store"))
    sampler = TaskSampler({"terminal_like": load_tasks("terminal_like", "train")}, group_size=GROUP, seed=11)
    buffer = TrajectoryBuffer.from_config(cfg)  # as a run builds it: buffer_size binds under the default budget
    ctl = RolloutController(cfg, InferenceClient(server.url, timeout_s=600), AutoTokenizer.from_pretrained(random_model_dir),
                            LocalRewardClient(Scorer()), sampler, buffer, run_id="many", writer=writer,
                            make_harness=lambda name: create(name, cfg, sandboxes=provider))
    try:
        deadline = time.monotonic() + 120  # the warm pool fills: every episode's sandbox is ready
        while (pool.metrics()["warm"] < episodes and not pool.counters["spawn_failures"]
               and time.monotonic() < deadline):
            time.sleep(0.1)
        warm = pool.metrics()["warm"]
        memory = MemoryPeak()
        t0 = time.perf_counter()

        async def go():
            try:
                await ctl.run(asyncio.Event(), max_groups=episodes // GROUP)
                wall = time.perf_counter() - t0
                memory.stop()
                return wall, await buffer.take(episodes // GROUP, current_version=1, timeout=5)
            finally:
                await ctl.client.close()
        wall, groups = asyncio.run(go())
        writer.flush()
        stored = read_records(writer.store)
        batches = list(engine.stats.batch_sizes)
        pool_counters = pool.metrics()
    finally:
        ctl.close()
        writer.close()
        leaks = sandboxes.close()
        server.stop()
        engine.close()
    return {"ctl": ctl, "buffer": buffer, "stored": stored, "wall_s": wall, "warm": warm, "memory": memory,
            "largest_batch": max(batches, default=0), "pool": pool_counters, "leaks": leaks,
            "shape": AutoConfig.from_pretrained(random_model_dir), "held": [e for group in groups for e in group]}


@pytest.mark.parametrize("episodes", [pytest.param(256, id="256"), pytest.param(64, marks=pytest.mark.long, id="64")])
def test_episodes_are_in_flight_at_once_none_is_lost_and_memory_stays_bounded(episodes, random_model_dir, tmp_path,
                                                                               sandbox_root, record_property):
    """256 in CI (10-25 s on 2 shared cores) and, under `-m long`, 64 (rollout.concurrency's default; ~6 s)."""
    got = _rollout(random_model_dir, tmp_path, sandbox_root, episodes)
    ctl, buffer, memory = got["ctl"], got["buffer"], got["memory"]
    bound = memory_bound(got, episodes)
    figures = {"episodes": episodes, "wall_s": round(got["wall_s"], 2),
               "in_flight_peak": ctl.counters["in_flight_peak"], "sandboxes_in_use_peak": got["pool"]["in_use_peak"],
               "largest_generation_batch": got["largest_batch"],
               "process_rss_start_mb": round(memory.start_rss / MB, 1), "process_rss_peak_mb": round(memory.peak_rss / MB, 1),
               "process_rss_growth_mb": round((memory.peak_rss - memory.start_rss) / MB, 1),
               "sandbox_processes_rss_peak_mb": round(memory.peak_children / MB, 1),
               "rss_peak_exact": memory.exact, **bound}
    for key, value in figures.items():
        record_property(key, value)
    print(f"\n{episodes} in flight:", ", ".join(f"{k}={v}" for k, v in figures.items()))
    # nothing lost: every episode started is stored and buffered, once
    assert got["warm"] == episodes
    stored_ids = [r.trajectory_id for r in got["stored"]]
    assert len(stored_ids) == len(set(stored_ids)) == episodes
    assert buffer.counters["put"] == len(got["held"]) == episodes and ctl.counters["episode_errors"] == 0
    # they were in flight at once: every one held its sandbox while the others did
    assert got["pool"]["in_use_peak"] == episodes and got["pool"]["acquired"] == episodes
    assert got["leaks"] == {"sandbox/leaked_processes": 0, "sandbox/leftover_dirs": 0}
    # the memory budget's estimate of an episode (config/buffer_budget.py) is at least what one holds
    assert all(held_bytes(e) <= episode_bytes(len(e.record.token_ids)) for e in got["held"])
    # memory bounded: what grew is what one batch of every episode's turn and the held episodes need
    assert memory.peak_rss - memory.start_rss < bound["rss_growth_bound_mb"] * MB


def memory_bound(got: dict, episodes: int) -> dict:
    """The most this process's RSS should grow by during the rollout, from what it must hold at once.
    The server decodes every episode's turn in one batch (B = episodes, P = the longest prompt), and
    its prefill materializes, in float32: the logits at every prompt position and their log-softmax
    (2 x B x P x vocab x 4 B), one layer's attention scores and their softmax (2 x B x heads x P^2 x
    4 B) and the MLP's three intermediate activations (3 x B x P x intermediate x 4 B); the tiny
    model's weights and KV cache are far smaller. To that: the held episodes as measured
    (`held_bytes`) and HEADROOM_MB for threads and allocator slack. At 256 episodes the margin
    measured here is about 1.5 MB an episode: a leak of that much per episode would not fit under it."""
    shape, b = got["shape"], episodes
    p = max(r.prompt_tokens for r in got["stored"])
    forward = 4 * b * p * (2 * shape.vocab_size + 2 * shape.num_attention_heads * p + 3 * shape.intermediate_size)
    held = [held_bytes(e) for e in got["held"]]
    total = forward + sum(held) + HEADROOM_MB * MB
    return {"longest_prompt_tokens": p, "batch_forward_mb": round(forward / MB, 1),
            "held_episode_kb_mean": round(sum(held) / len(held) / 1024, 1), "held_episode_kb_max": round(max(held) / 1024, 1),
            "held_tokens_mean": round(sum(len(e.record.token_ids) for e in got["held"]) / len(held), 1),
            "rss_growth_bound_mb": round(total / MB, 1)}
