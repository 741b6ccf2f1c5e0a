"""Sandbox acquire time during a rollout: terminal_like episodes through the RolloutController, their
sandboxes taken from the run's per-harness warm pools (`HarnessSandboxes`, what training uses) against
a sandbox started per episode (`DirectProvider`, what training used before), side by side in one run
on the same model, tasks and seeds, with one embedded inference server in its own process. Also the
pools' leak counters after the rollout. Target: warm-pool acquire p50 under 5 ms.

    python benchmarks/rollout_sandboxes.py [--json] [--model PATH] [--episodes 32] [--concurrency 8]
"""

from __future__ import annotations

import asyncio
import logging
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrl_cli.config import load_config  # noqa: E402
from benchmarks._common import default_model, figure, parser, percentile, report  # noqa: E402

GROUP_SIZE = 4
T0 = time.perf_counter()


def say(msg: str) -> None:
    print(f"[sandbox acquire bench {time.perf_counter() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


async def _rollout(label: str, cfg, client, tokenizer, provider, episodes: int) -> list[float]:
    from agentrl_cli.runtime.reward.client import LocalRewardClient
    from agentrl_cli.runtime.reward.scorer import Scorer
    from agentrl_cli.runtime.rollout.buffer import TrajectoryBuffer
    from agentrl_cli.runtime.rollout.controller import RolloutController
    from agentrl_cli.runtime.rollout.sampler import TaskSampler
    from harnesses.registry import create
    from harnesses.tasks import load_tasks

    sampler = TaskSampler({"terminal_like": load_tasks("terminal_like", "train")}, group_size=GROUP_SIZE, seed=3)
    buffer = TrajectoryBuffer(episodes, max_staleness=10, group_size=GROUP_SIZE)
    ctl = RolloutController(cfg, client, tokenizer, LocalRewardClient(Scorer()), sampler, buffer, run_id=f"bench-{label}",
                            make_harness=lambda name: create(name, cfg, sandboxes=provider))
    t0 = time.perf_counter()
    try:
        await ctl.run(asyncio.Event(), max_groups=episodes // GROUP_SIZE)
    finally:
        ctl.close()
    say(f"{label}: {len(provider.acquire_s)} sandboxes acquired in {time.perf_counter() - t0:.1f} s, "
        f"{ctl.counters['episode_errors']} episode errors")
    return list(provider.acquire_s)


async def _both(cfg, url: str, model: Path, episodes: int) -> tuple[list[float], list[float], dict]:
    from transformers import AutoTokenizer

    from agentrl_cli.engines.inference.client import InferenceClient
    from agentrl_cli.envs.sandbox import SandboxSettings
    from agentrl_cli.envs.sandbox.provider import DirectProvider, HarnessSandboxes, TimedProvider

    tokenizer = AutoTokenizer.from_pretrained(model)
    client = InferenceClient(url, timeout_s=600)
    try:
        cold = await _rollout("cold", cfg, client, tokenizer, TimedProvider(DirectProvider(SandboxSettings.from_config(cfg.sandbox))),
                              episodes)
        pools = HarnessSandboxes(cfg)
        try:
            warm = await _rollout("warm pool", cfg, client, tokenizer, pools.for_harness("terminal_like"), episodes)
        finally:
            leaks = pools.close()
    finally:
        await client.close()
    return cold, warm, leaks


def main() -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--model", default="", help="model directory (default: the built-in tiny model when cached, else a random one)")
    p.add_argument("--episodes", type=int, default=32, help="episodes per side (a multiple of 4)")
    p.add_argument("--concurrency", type=int, default=8)
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    from agentrl_cli.engines.inference.launcher import launch
    from benchmarks.inference import _free_port

    model = Path(args.model) if args.model else default_model()
    sets = [f"inference.port={_free_port()}", f"rollout.group_size={GROUP_SIZE}", "rollout.max_steps_per_trajectory=2",
            "inference.max_new_tokens=24", f"rollout.concurrency={args.concurrency}", f"sandbox.pool_size={args.concurrency}",
            'harnesses=[{"name": "terminal_like"}]']
    cfg = load_config(None, sets, env={}).config
    say(f"model {model}; starting the inference server")
    servers, urls = launch(cfg, str(model), Path(tempfile.mkdtemp(prefix="agentrl-bench-logs-")))
    try:
        cold, warm, leaks = asyncio.run(_both(cfg, urls[0], model, args.episodes))
    finally:
        for s in servers:
            s.stop()
    warm_p50, cold_p50 = percentile(warm, 0.5) * 1000, percentile(cold, 0.5) * 1000
    figures = {
        "warm_pool_acquire_p50_ms": figure(warm_p50, "ms", "< 5", warm_p50 < 5),
        "warm_pool_acquire_p99_ms": figure(percentile(warm, 0.99) * 1000, "ms"),
        "cold_start_acquire_p50_ms": figure(cold_p50, "ms"),
        "cold_start_acquire_p99_ms": figure(percentile(cold, 0.99) * 1000, "ms"),
        "cold_over_warm_p50": figure(cold_p50 / warm_p50 if warm_p50 else float("inf"), "x"),
        "pool_leaked_processes": figure(leaks.get("sandbox/leaked_processes", -1), "processes", "0",
                                        leaks.get("sandbox/leaked_processes") == 0),
        "pool_leftover_dirs": figure(leaks.get("sandbox/leftover_dirs", -1), "dirs", "0", leaks.get("sandbox/leftover_dirs") == 0),
    }
    return report(figures, args.json)


if __name__ == "__main__":
    sys.exit(main())
