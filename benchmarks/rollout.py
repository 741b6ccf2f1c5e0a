"""Rollout benchmark: episodes/s of the asynchronous rollout (many episodes in flight) against the
naive loop (one episode at a time), on the same model and tasks, with 300 ms of latency injected
into every tool call (tool_api_like); the inference server's busy fraction during the async run
(share of 20 ms samples of /metrics with a running request); and weight sync time against train
step time. Targets (issue 6): async >= 10x naive; server busy >= 90% of wall time; weight sync
<= 5% of step time. The `distributed` transport is not built yet and is reported as such.

    python benchmarks/rollout.py [--json] [--model PATH] [--episodes 128] [--concurrency 64]
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402

from agentrl_cli.config import load_config  # noqa: E402
from benchmarks._common import figure, parser, report  # noqa: E402

LATENCY_MS = 300.0


def _config(port: int, concurrency: int):
    sets = [f"inference.port={port}", f"rollout.concurrency={concurrency}", "rollout.group_size=4",
            "rollout.max_steps_per_trajectory=4", "inference.max_new_tokens=64", "inference.max_batch_size=64",
            f"rollout.buffer_size={max(concurrency * 4, 64)}", 'harnesses=[{"name": "tool_api_like"}]']
    return load_config(None, sets, env={}).config


async def _rollout(cfg, url: str, model: Path, episodes: int, concurrency: int, busy: list | None) -> dict:
    from transformers import AutoTokenizer

    from agentrl_cli.inference.client import InferenceClient
    from agentrl_cli.reward.client import LocalRewardClient
    from agentrl_cli.reward.scorer import Scorer
    from agentrl_cli.rollout.buffer import TrajectoryBuffer
    from agentrl_cli.rollout.controller import RolloutController
    from agentrl_cli.rollout.sampler import TaskSampler
    from harnesses.tasks import load_tasks
    from harnesses.tool_api_like import ToolApiLike
    from harnesses.tool_service import Faults

    cfg = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"concurrency": concurrency})})
    sampler = TaskSampler({"tool_api_like": load_tasks("tool_api_like", "train")}, group_size=4, seed=3)
    buffer = TrajectoryBuffer(episodes + 8, max_staleness=10, group_size=4)
    client = InferenceClient(url, timeout_s=600)
    ctl = RolloutController(cfg, client, AutoTokenizer.from_pretrained(model), LocalRewardClient(Scorer()), sampler, buffer,
                            run_id="bench", make_harness=lambda name: ToolApiLike(faults=Faults(latency_ms=LATENCY_MS)))
    sampler_task = asyncio.create_task(_sample_busy(url, busy)) if busy is not None else None
    t0 = time.perf_counter()
    try:
        await ctl.run(asyncio.Event(), max_groups=episodes // 4)
    finally:
        wall = time.perf_counter() - t0
        if sampler_task is not None:
            sampler_task.cancel()
        ctl.close()
        await client.close()
    done = sum(v for k, v in ctl.counters.items() if k.startswith("termination_"))
    return {"episodes": done, "wall_s": wall, "episodes_per_s": done / wall, "tokens": ctl.counters["tokens_generated"],
            "errors": ctl.counters["episode_errors"]}


async def _sample_busy(url: str, out: list) -> None:
    async with httpx.AsyncClient() as http:
        while True:
            text = (await http.get(url + "/metrics")).text
            running = next((float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                            if line.startswith("sglang:num_running_reqs")), 0.0)
            out.append(running > 0)
            await asyncio.sleep(0.02)


def _sync_vs_step(model: Path, url: str) -> tuple[float, float]:
    """Seconds of one verified disk weight sync and of one train step on 16 samples."""
    import numpy as np

    from agentrl_cli.inference.client import InferenceClient
    from agentrl_cli.training.deepspeed_backend import DeepSpeedBackend
    from agentrl_cli.training.grpo import Sample
    from agentrl_cli.training.weight_sync import DiskWeightSync

    cfg = load_config(None, ["training.micro_batch_size=16"], env={}).config
    backend = DeepSpeedBackend(str(model), cfg.training)
    rng = np.random.default_rng(0)
    samples = [Sample(token_ids=rng.integers(0, 250, 400).tolist(), loss_mask=[0] * 200 + [1] * 200,
                      logprobs=[0.0] * 200 + [-1.0] * 200, advantage=float(rng.normal())) for _ in range(16)]
    try:
        backend.train_step(samples)  # warm-up
        t = time.perf_counter()
        backend.train_step(samples)
        step_s = time.perf_counter() - t

        async def sync() -> float:
            client = InferenceClient(url)
            try:
                return (await DiskWeightSync(client, Path(tempfile.mkdtemp(prefix="agentrl-bench-w-"))).sync(backend, 1))["seconds"]
            finally:
                await client.close()
        return asyncio.run(sync()), step_s
    finally:
        backend.close()


def main() -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--model", default="", help="model directory (default: the built-in tiny model when cached, else a random one)")
    p.add_argument("--episodes", type=int, default=128)
    p.add_argument("--naive-episodes", type=int, default=8, help="episodes for the one-at-a-time loop (it is slow)")
    p.add_argument("--concurrency", type=int, default=64)
    args = p.parse_args()
    from agentrl_cli.inference.launcher import launch
    from benchmarks.inference import _free_port

    model = Path(args.model) if args.model else _default_model()
    cfg = _config(_free_port(), args.concurrency)
    servers, urls = launch(cfg, str(model), Path(tempfile.mkdtemp(prefix="agentrl-bench-logs-")))
    figures: dict = {}
    try:
        busy: list = []
        naive = asyncio.run(_rollout(cfg, urls[0], model, args.naive_episodes, 1, None))
        fast = asyncio.run(_rollout(cfg, urls[0], model, args.episodes, args.concurrency, busy))
        ratio = fast["episodes_per_s"] / naive["episodes_per_s"]
        figures["naive_episodes_per_s"] = figure(naive["episodes_per_s"], "episodes/s (one at a time)")
        figures["async_episodes_per_s"] = figure(fast["episodes_per_s"], f"episodes/s (concurrency {args.concurrency})")
        figures["async_vs_naive"] = figure(ratio, "x", ">= 10", ratio >= 10)
        share = sum(busy) / len(busy) if busy else 0.0
        figures["server_busy_fraction"] = figure(share, "of wall time", ">= 0.9", share >= 0.9)
        figures["episode_errors"] = figure(naive["errors"] + fast["errors"], "count", "0", naive["errors"] + fast["errors"] == 0)
        sync_s, step_s = _sync_vs_step(model, urls[0])
        figures["disk_sync_s"] = figure(sync_s, "s")
        figures["train_step_s"] = figure(step_s, "s (16 samples)")
        figures["sync_share_of_step"] = figure(sync_s / (sync_s + step_s), "of step time", "<= 0.05", sync_s / (sync_s + step_s) <= 0.05)
        figures["distributed_sync_s"] = figure(float("nan"), "s (transport not built yet)")
    finally:
        for s in servers:
            s.stop()
    return report(figures, args.json)


def _default_model() -> Path:
    from agentrl_cli.errors import NotFoundError
    from agentrl_cli.model.resolve import resolve_model_path
    from agentrl_cli.model.tiny import build_random

    cfg = load_config(None, [], env={}).config
    try:
        return resolve_model_path(cfg.model.path, cfg.model.cache_dir, build=False)
    except NotFoundError:
        pass

    return build_random(Path(tempfile.mkdtemp(prefix="agentrl-bench-")) / "tiny", seed=0)


if __name__ == "__main__":
    sys.exit(main())
