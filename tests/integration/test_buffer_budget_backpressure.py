"""`rollout.max_buffer_mb` honoured by the real rollout controller against the embedded inference server
(a random tiny model, in a thread): a budget that holds four episodes keeps in flight plus buffered at
four although concurrency allows eight, generation waits while the budget is full, and every episode
is trained in the end: none dropped."""

from __future__ import annotations

import asyncio

import pytest
from transformers import AutoTokenizer

from agentrl_cli.config import load_config
from agentrl_cli.engines.inference.client import InferenceClient
from agentrl_cli.runtime.data.local_store import LocalStore
from agentrl_cli.runtime.data.writer import TrajectoryWriter, read_records
from agentrl_cli.runtime.reward.client import LocalRewardClient
from agentrl_cli.runtime.reward.scorer import Scorer
from agentrl_cli.runtime.rollout.buffer import TrajectoryBuffer
from agentrl_cli.runtime.rollout.controller import RolloutController
from agentrl_cli.runtime.rollout.sampler import TaskSampler
from harnesses.tasks import load_tasks

pytestmark = pytest.mark.integration
GROUPS, GROUP = 4, 2


def test_a_small_memory_budget_holds_back_generation_and_drops_nothing(server, random_model_dir, tmp_path):
    # context 1024: 1024 x 17 B + 16 KiB = 33,792 B an episode; 0.15 MiB holds 4 of them
    cfg = load_config(None, ["rollout.max_buffer_mb=0.15", "model.context_length=1024", "rollout.concurrency=8",
                             f"rollout.group_size={GROUP}", "rollout.max_steps_per_trajectory=1", "inference.max_new_tokens=8"],
                      env={}).config
    buffer = TrajectoryBuffer.from_config(cfg)
    assert buffer.capacity == 4 and buffer.limit.binds == "rollout.max_buffer_mb"
    writer = TrajectoryWriter(LocalStore(tmp_path / "store"))
    ctl = RolloutController(cfg, InferenceClient(server.url), AutoTokenizer.from_pretrained(random_model_dir),
                            LocalRewardClient(Scorer()), TaskSampler({"tool_api_like": load_tasks("tool_api_like", "train")},
                                                                     group_size=GROUP, seed=5),
                            buffer, run_id="budget", writer=writer)
    held_back = {}

    async def go():
        loop = asyncio.get_running_loop()
        runner = asyncio.create_task(ctl.run(asyncio.Event(), max_groups=GROUPS))
        deadline = loop.time() + 60
        while not (len(buffer) == buffer.capacity and ctl.in_flight == 0):  # the budget is full of finished episodes
            assert loop.time() < deadline and not runner.done(), "the buffer never filled to its budget"
            await asyncio.sleep(0.01)
        waits, generated = ctl.counters["backpressure_waits"], ctl.counters["tokens_generated"]
        while ctl.counters["backpressure_waits"] < waits + 10:  # the loop looked ten more times, and waited
            assert loop.time() < deadline
            await asyncio.sleep(0.01)
        held_back.update(in_flight=ctl.in_flight, generated=ctl.counters["tokens_generated"] - generated)
        taken = []
        while len(taken) < GROUPS:  # the trainer takes groups: room again, the rest is generated
            taken += await buffer.take(1, current_version=3, timeout=30)
            assert loop.time() < deadline
        await runner
        await ctl.client.close()
        return taken
    try:
        taken = asyncio.run(go())
    finally:
        ctl.close()
        writer.close()
    assert held_back == {"in_flight": 0, "generated": 0}  # nothing started while the budget was full
    assert ctl.counters["held_peak"] == 4 and ctl.counters["in_flight_peak"] <= 4 < cfg.rollout.concurrency
    episodes = GROUPS * GROUP
    assert sum(len(g) for g in taken) == buffer.counters["put"] == buffer.counters["taken"] == episodes
    assert buffer.counters["dropped_stale"] == 0 and ctl.counters["episode_errors"] == 0
    assert len({r.trajectory_id for r in read_records(writer.store)}) == episodes
