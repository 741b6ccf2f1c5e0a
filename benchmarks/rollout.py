"""Rollout benchmark: episodes/s of the asynchronous rollout (RolloutController at concurrency 64)
against the naive loop (the same controller at concurrency 1: one episode at a time, each
generation and each tool call awaited in turn), on the same model, the same tasks and seeds, and one
embedded inference server in its own process, with 300 ms of tool latency injected into every
environment step; the server's busy fraction (seconds inside a batch, from /server_info, over wall
time) during each — judged over the whole async run, and reported as well for the span in which
every slot is filled (from `concurrency` episodes in flight until the last episode has started);
and the weight sync against the train step, `disk` and `distributed` side by side.
Targets (issue 6): async >= 10x naive; server busy >= 90% of wall time; weight sync <= 5% of step time.

Tool latency: the built-in tiny model rarely writes a well-formed tool call for tool_api_like, so the
tool service's own `Faults(latency_ms=...)` would seldom fire; `StepLatency` (below) instead adds the
latency to every step, i.e. to every model turn the environment answers. Progress goes to stderr.

    python benchmarks/rollout.py [--json] [--model PATH] [--episodes 256] [--naive-episodes 8]
                                 [--concurrency 64] [--max-new-tokens 32] [--sync-rounds 3] [--server-threads 0]
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402

from agentrl_cli.config import load_config  # noqa: E402
from benchmarks._common import default_model, figure, parser, report  # noqa: E402

LATENCY_MS = 300.0
GROUP_SIZE = 4
T0 = time.perf_counter()


def say(msg: str) -> None:
    print(f"[rollout bench {time.perf_counter() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


class StepLatency:
    """A harness whose every step takes `latency_s` longer (slept in the harness's thread, as a remote
    tool's round trip would be); everything else is the wrapped harness's."""

    def __init__(self, harness, latency_s: float) -> None:
        self.harness, self.latency_s = harness, latency_s

    def __getattr__(self, name: str):
        return getattr(self.harness, name)

    def step(self, action):
        time.sleep(self.latency_s)
        return self.harness.step(action)


def _config(port: int, max_new_tokens: int, server_threads: int = 0):
    sets = [f"inference.port={port}", f"inference.cpu_threads={server_threads}", f"rollout.group_size={GROUP_SIZE}", "rollout.max_steps_per_trajectory=4",
            f"inference.max_new_tokens={max_new_tokens}", "inference.max_batch_size=64",
            "training.micro_batch_size=4", "training.gradient_accumulation_steps=4",  # a step: 16 trajectories
            'harnesses=[{"name": "tool_api_like"}]']
    return load_config(None, sets, env={}).config


def _busy_s(url: str) -> float:
    return float(httpx.get(url + "/server_info", timeout=30).json()["internal_states"][0]["busy_seconds_total"])


async def _progress(label: str, ctl, total: int) -> None:
    while True:
        await asyncio.sleep(10)
        done = _finished(ctl)
        say(f"{label}: {done}/{total} episodes done, {ctl.in_flight} in flight")


def _finished(ctl) -> int:
    return sum(v for k, v in ctl.counters.items() if k.startswith("termination_")) + ctl.counters["episode_errors"]


async def _steady_window(ctl, url: str, total: int, concurrency: int, out: dict) -> None:
    """(time, server busy seconds) when `concurrency` episodes are first in flight and when the last
    episode has started: the span in which the rollout has more work than slots."""
    while ctl.in_flight < min(concurrency, total):
        await asyncio.sleep(0.01)
    out["start"] = (time.perf_counter(), await asyncio.to_thread(_busy_s, url))
    while _finished(ctl) + ctl.in_flight < total:
        await asyncio.sleep(0.01)
    out["end"] = (time.perf_counter(), await asyncio.to_thread(_busy_s, url))


async def _rollout(label: str, cfg, client, tokenizer, tool_url: str, episodes: int, concurrency: int) -> dict:
    """`episodes` (a multiple of the group size) through a RolloutController at `concurrency`."""
    from agentrl_cli.runtime.reward.client import LocalRewardClient
    from agentrl_cli.runtime.reward.scorer import Scorer
    from agentrl_cli.runtime.rollout.buffer import TrajectoryBuffer
    from agentrl_cli.runtime.rollout.controller import RolloutController
    from agentrl_cli.runtime.rollout.sampler import TaskSampler
    from harnesses.tasks import load_tasks
    from harnesses.tool_api_like import ToolApiLike

    cfg = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"concurrency": concurrency})})
    sampler = TaskSampler({"tool_api_like": load_tasks("tool_api_like", "train")}, group_size=GROUP_SIZE, seed=3)
    buffer = TrajectoryBuffer(episodes, max_staleness=10, group_size=GROUP_SIZE)
    ctl = RolloutController(cfg, client, tokenizer, LocalRewardClient(Scorer()), sampler, buffer, run_id=f"bench-{label}",
                            make_harness=lambda name: StepLatency(ToolApiLike(service_url=tool_url), LATENCY_MS / 1000.0))
    say(f"{label}: {episodes} episodes at concurrency {concurrency}")
    progress = asyncio.create_task(_progress(label, ctl, episodes))
    steady: dict = {}
    watch = asyncio.create_task(_steady_window(ctl, client.urls[0], episodes, concurrency, steady))
    busy0, t0, cpu0 = _busy_s(client.urls[0]), time.perf_counter(), time.process_time()
    try:
        await ctl.run(asyncio.Event(), max_groups=episodes // GROUP_SIZE)
        wall, busy = time.perf_counter() - t0, _busy_s(client.urls[0]) - busy0
        cpu = time.process_time() - cpu0
    finally:
        progress.cancel()
        watch.cancel()
        ctl.close()
    if "end" in steady:
        (ta, ba), (tb, bb) = steady["start"], steady["end"]
        steady_fraction, steady_s = (bb - ba) / (tb - ta) if tb > ta else float("nan"), tb - ta
    else:
        steady_fraction, steady_s = float("nan"), 0.0
    done = sum(v for k, v in ctl.counters.items() if k.startswith("termination_"))
    steps = ctl.counters["env_calls"] - done  # env calls are one reset + the steps of each episode
    result = {"episodes": done, "wall_s": wall, "episodes_per_s": done / wall, "tokens": ctl.counters["tokens_generated"],
              "tokens_per_s": ctl.counters["tokens_generated"] / wall, "errors": ctl.counters["episode_errors"],
              "busy_fraction": busy / wall, "steady_busy_fraction": steady_fraction, "steady_s": steady_s, "steps": steps,
              "episodes_list": [e for g in await buffer.take(episodes // GROUP_SIZE, 0, timeout=1) for e in g]}
    say(f"{label}: {done} episodes, {steps} tool steps, {result['tokens']} tokens in {wall:.1f} s "
        f"({result['episodes_per_s']:.3f} episodes/s), server busy {result['busy_fraction']:.1%} "
        f"({steady_fraction:.1%} over the {steady_s:.1f} s with every slot filled), "
        f"this process's CPU {cpu:.1f} s, errors {result['errors']}")
    return result


async def _rollouts(cfg, url: str, model: Path, tool_url: str, args) -> tuple[dict, dict]:
    from transformers import AutoTokenizer

    from agentrl_cli.engines.inference.client import InferenceClient

    tokenizer = AutoTokenizer.from_pretrained(model)
    client = InferenceClient(url, timeout_s=600)
    try:
        naive = await _rollout("naive", cfg, client, tokenizer, tool_url, args.naive_episodes, 1)
        fast = await _rollout("async", cfg, client, tokenizer, tool_url, args.episodes, args.concurrency)
    finally:
        await client.close()
    return naive, fast


def _train_samples(episodes: list, count: int) -> list:
    """`count` trajectories of the rollout, whole groups first, as the training loop makes them."""
    from agentrl_cli.learner.grpo import Sample, group_advantages

    eps = [e for e in episodes if e.reward is not None]
    while eps and len(eps) < count:
        eps = eps + eps
    eps = eps[:count]
    adv = group_advantages([e.reward for e in eps], [e.group_id for e in eps])
    return [Sample(token_ids=e.record.token_ids, loss_mask=e.record.loss_mask, logprobs=e.record.logprobs, advantage=a)
            for e, a in zip(eps, adv)]


async def _step_and_sync(backend, samples: list, url: str, rounds: int) -> dict:
    """Rounds of train step, disk sync, train step, distributed sync (the first opens the group)."""
    from agentrl_cli.engines.inference.client import InferenceClient
    from agentrl_cli.weightsync.disk import DiskTransport
    from agentrl_cli.weightsync.distributed import DistributedTransport
    from agentrl_cli.weightsync.publisher import WeightPublisher

    client = InferenceClient(url, timeout_s=600)
    syncs = {"disk": WeightPublisher(DiskTransport(client, Path(tempfile.mkdtemp(prefix="agentrl-bench-w-"))), client),
             "distributed": WeightPublisher(DistributedTransport(client, backend="gloo"), client)}
    steps: list[float] = []
    version = 0
    try:
        await asyncio.to_thread(backend.train_step, samples)  # warm-up
        for r in range(rounds):
            for name, sync in syncs.items():
                t = time.perf_counter()
                await asyncio.to_thread(backend.train_step, samples)
                steps.append(time.perf_counter() - t)
                version += 1
                entry = await sync.sync(backend, version)
                parts = ", ".join(f"{k[:-2]} {entry[k]:.3f}" for k in ("export_s", "load_s", "verify_s") if k in entry)
                say(f"round {r + 1}/{rounds}: train step {steps[-1]:.2f} s, {name} sync {entry['seconds']:.3f} s"
                    + (f" ({parts})" if parts else ""))
        return {"step_s": steps, "disk": syncs["disk"].history, "distributed": syncs["distributed"].history}
    finally:
        await syncs["distributed"].close()
        await client.close()


def _weight_sync(model: Path, cfg, url: str, episodes: list, rounds: int) -> dict:
    from agentrl_cli.learner.deepspeed_backend import DeepSpeedBackend
    from agentrl_cli.run.training_run import samples_per_step

    say("weight sync: starting the DeepSpeed backend")
    backend = DeepSpeedBackend(str(model), cfg.training)
    try:
        samples = _train_samples(episodes, samples_per_step(cfg))
        return {**asyncio.run(_step_and_sync(backend, samples, url, rounds)), "samples": len(samples),
                "tokens": sum(len(s.token_ids) for s in samples)}
    finally:
        backend.close()


def main() -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--model", default="", help="model directory (default: the built-in tiny model when cached, else a random one)")
    p.add_argument("--episodes", type=int, default=256,
                   help="episodes of the async rollout (a multiple of 4; four waves of 64 so ramp-up and ramp-down stay small)")
    p.add_argument("--naive-episodes", type=int, default=8,
                   help="episodes of the one-at-a-time loop (it is slow; a multiple of 4)")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=32, help="most tokens per model turn")
    p.add_argument("--sync-rounds", type=int, default=3, help="train steps and syncs per transport")
    p.add_argument("--server-threads", type=int, default=0,
                   help="inference.cpu_threads of the server (default 0: auto, as a training run splits the cores)")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    from agentrl_cli.engines.inference.launcher import launch
    from benchmarks.inference import _free_port
    from harnesses.tool_api_like import all_tables
    from harnesses.tool_service import ToolService

    model = Path(args.model) if args.model else default_model()
    cfg = _config(_free_port(), args.max_new_tokens, args.server_threads)
    say(f"model {model}; starting the inference server")
    servers, urls = launch(cfg, str(model), Path(tempfile.mkdtemp(prefix="agentrl-bench-logs-")))
    tools = ToolService(all_tables()).start()  # one tool service for every harness instance
    try:
        naive, fast = asyncio.run(_rollouts(cfg, urls[0], model, tools.url, args))
        ws = _weight_sync(model, cfg, urls[0], fast["episodes_list"], args.sync_rounds)
    finally:
        tools.stop()
        for s in servers:
            s.stop()
    return report(_figures(args, naive, fast, ws), args.json)


def _figures(args, naive: dict, fast: dict, ws: dict) -> dict:
    ratio = fast["episodes_per_s"] / naive["episodes_per_s"]
    errors = naive["errors"] + fast["errors"]
    step_s = statistics.median(ws["step_s"])
    figures = {
        "naive_episodes_per_s": figure(naive["episodes_per_s"], f"episodes/s (one at a time; {naive['episodes']} episodes, "
                                       f"{naive['steps']} tool steps of {LATENCY_MS:g} ms)"),
        "async_episodes_per_s": figure(fast["episodes_per_s"], f"episodes/s (concurrency {args.concurrency}; "
                                       f"{fast['episodes']} episodes, {fast['steps']} tool steps of {LATENCY_MS:g} ms)"),
        "async_vs_naive": figure(ratio, "x (episodes/s)", ">= 10", ratio >= 10),
        "async_vs_naive_tokens": figure(fast["tokens_per_s"] / naive["tokens_per_s"],
                                        f"x (tokens/s: {fast['tokens_per_s']:.1f} vs {naive['tokens_per_s']:.1f})"),
        "server_busy_fraction": figure(fast["busy_fraction"], "of wall time (async rollout, whole run: its ramp-up and its "
                                      f"tail of fewer than {args.concurrency} episodes left included)", ">= 0.9",
                                      fast["busy_fraction"] >= 0.9),
        "server_busy_fraction_steady": figure(fast["steady_busy_fraction"], f"of wall time while every slot is filled "
                                              f"({fast['steady_s']:.1f} s from {args.concurrency} episodes in flight to the "
                                              "last one started)"),
        "naive_server_busy_fraction": figure(naive["busy_fraction"], "of wall time (naive loop)"),
        "episode_errors": figure(errors, "count", "0", errors == 0),
        "train_step_s": figure(step_s, f"s per train step (median of {len(ws['step_s'])}; {ws['samples']} trajectories "
                               f"of this rollout, {ws['tokens']} tokens)"),
    }
    for name in ("disk", "distributed"):
        steady = [e for e in ws[name] if not e.get("init_s")]  # a distributed sync that opened the group apart
        history = steady or ws[name]
        sync_s = statistics.median(e["seconds"] for e in history)
        verified = all(e["verified_tensors"] > 0 for e in ws[name])
        note = "" if name == "disk" else ", group reused" if steady else ", includes opening the group"
        figures[f"{name}_sync_s"] = figure(sync_s, f"s per verified sync (median of {len(history)}{note})")
        share = sync_s / step_s
        figures[f"{name}_sync_share_of_step"] = figure(share, "sync s / train step s", "<= 0.05", verified and share <= 0.05)
    first = ws["distributed"][0]
    figures["distributed_first_sync_s"] = figure(first["seconds"], f"s (opens the group: {first['init_s']} s)")
    figures["benchmark_wall_s"] = figure(time.perf_counter() - T0, "s")
    return figures


if __name__ == "__main__":
    sys.exit(main())
