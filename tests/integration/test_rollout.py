"""The rollout against the real embedded inference server (a random tiny model): episodes of real
harnesses, exact token bookkeeping (the stored tokens are the chat template's rendering of the
conversation; the loss mask covers exactly the generated tokens), reward and store wiring, GRPO
groups, staleness drops and backpressure."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from transformers import AutoTokenizer

from agentrl_cli.config import load_config
from agentrl_cli.runtime.data.local_store import LocalStore
from agentrl_cli.runtime.data.writer import TrajectoryWriter, read_records
from agentrl_cli.engines.inference.client import InferenceClient
from agentrl_cli.runtime.reward.client import LocalRewardClient
from agentrl_cli.runtime.reward.scorer import Scorer
from agentrl_cli.runtime.rollout.buffer import Episode, TrajectoryBuffer
from agentrl_cli.runtime.rollout.controller import RolloutController
from agentrl_cli.runtime.rollout.sampler import TaskSampler
from harnesses.tasks import load_tasks
from tests.integration.conftest import needs_bwrap

pytestmark = [pytest.mark.integration, needs_bwrap]


def run_closing(ctl, coro):
    """asyncio.run(coro), closing the controller's inference client in the same event loop."""
    async def main():
        try:
            return await coro
        finally:
            await ctl.client.close()
    return asyncio.run(main())


def make_controller(server, random_model_dir, tmp_path, harnesses=("tool_api_like", "terminal_like"), phase="train", **rollout):
    sets = [f"rollout.{k}={v}" for k, v in {"concurrency": 8, "group_size": 2, "max_steps_per_trajectory": 3,
                                             "buffer_size": 16, **rollout}.items()]
    cfg = load_config(None, sets + ["inference.max_new_tokens=24"], env={}).config
    sampler = TaskSampler({h: load_tasks(h, "train") for h in harnesses}, group_size=cfg.rollout.group_size, seed=7)
    buffer = TrajectoryBuffer(cfg.rollout.buffer_size, cfg.rollout.max_staleness, cfg.rollout.group_size)
    writer = TrajectoryWriter(LocalStore(tmp_path / "store"))
    ctl = RolloutController(cfg, InferenceClient(server.url), AutoTokenizer.from_pretrained(random_model_dir),
                            LocalRewardClient(Scorer()), sampler, buffer, run_id="t", writer=writer, phase=phase)
    return ctl, writer


def test_two_phases_of_one_run_store_the_same_draws_under_different_ids(server, random_model_dir, tmp_path):
    """`agentrl stage run all`: stage 0's baseline and stage 8's smoke run share a run id and draw the same groups."""
    ids = {}
    for phase in ("baseline", "smoke"):
        ctl, writer = make_controller(server, random_model_dir, tmp_path, harnesses=("tool_api_like",), phase=phase,
                                      max_steps_per_trajectory=1)
        try:
            run_closing(ctl, ctl.run(asyncio.Event(), max_groups=2))
        finally:
            ctl.close()
            writer.close()
        ids[phase] = {r.trajectory_id for r in read_records(writer.store) if r.phase == phase}
    assert len(ids["baseline"]) == len(ids["smoke"]) == 4 and not ids["baseline"] & ids["smoke"]
    stored = [r.trajectory_id for r in read_records(writer.store)]
    assert len(stored) == len(set(stored)) == 8


def test_episodes_flow_into_the_buffer_and_the_store_with_exact_tokens(server, random_model_dir, tmp_path):
    ctl, writer = make_controller(server, random_model_dir, tmp_path)
    tok = ctl.tokenizer

    async def go():
        await ctl.run(asyncio.Event(), max_groups=3)
        return await ctl.buffer.take(3, current_version=3, timeout=5)
    try:
        groups = run_closing(ctl, go())
    finally:
        ctl.close()
        writer.close()
    assert len(groups) == 3 and all(len(g) == 2 and len({e.group_id for e in g}) == 1 for g in groups)
    for group in groups:
        for ep in group:
            r = ep.record
            ids, mask, lps = np.asarray(r.token_ids), np.asarray(r.loss_mask), np.asarray(r.logprobs)
            assert len(ids) == len(mask) == len(lps) and mask.sum() == r.completion_tokens > 0
            assert (lps[mask == 0] == 0).all() and (lps[mask == 1] <= 0).all()
            # the tokens are the template's rendering of the conversation, turn by turn
            text = tok.decode(ids.tolist(), skip_special_tokens=False)
            assert text.startswith("<|im_start|>system\n") and r.steps[0].action in text
            for step in r.steps[:-1]:
                assert f"<tool_response>\n{step.observation}\n</tool_response>" in text
            assert r.policy_version_first == "3" and ep.version == 3
            assert r.reward_status in ("ok", "fail") and r.turns == len(r.steps) >= 1
    stored = read_records(ctl.writer.store)
    assert len(stored) == 6 and {s.group_id for s in stored} == {g[0].group_id for g in groups}
    assert ctl.counters["tokens_generated"] == sum(e.record.completion_tokens for g in groups for e in g)


def test_the_step_limit_is_recorded_as_truncated(server, random_model_dir, tmp_path):
    ctl, writer = make_controller(server, random_model_dir, tmp_path, harnesses=("tool_api_like",), max_steps_per_trajectory=1)
    try:
        run_closing(ctl, ctl.run(asyncio.Event(), max_groups=2))
    finally:
        ctl.close()
        writer.close()
    outcomes = {r.outcome for r in read_records(writer.store)}
    assert ctl.counters["termination_truncated"] + ctl.counters["termination_done"] == 4
    assert outcomes <= {"truncated", "success", "fail", "partial"}


def test_backpressure_never_lets_the_buffer_overflow(server, random_model_dir, tmp_path):
    ctl, writer = make_controller(server, random_model_dir, tmp_path, harnesses=("tool_api_like",), buffer_size=4,
                                  concurrency=4)
    seen = []

    async def go():
        stop = asyncio.Event()
        runner = asyncio.create_task(ctl.run(stop, max_groups=6))
        taken = 0
        while taken < 6:
            seen.append(len(ctl.buffer))
            groups = await ctl.buffer.take(1, current_version=3, timeout=30)
            taken += len(groups)
        stop.set()
        await runner
    try:
        run_closing(ctl, go())
    finally:
        ctl.close()
        writer.close()
    assert max(seen) <= 4 and ctl.counters["backpressure_waits"] > 0


def test_a_concurrency_below_the_group_size_runs_the_group_one_episode_at_a_time(server, random_model_dir, tmp_path):
    # regression: a group started only when all its episodes fitted under `concurrency`, so
    # concurrency 1 with groups of 2 never started anything and `run` spun forever
    ctl, writer = make_controller(server, random_model_dir, tmp_path, harnesses=("tool_api_like",), concurrency=1,
                                  max_steps_per_trajectory=1)
    peak = []

    async def go():
        runner = asyncio.create_task(ctl.run(asyncio.Event(), max_groups=2))
        deadline = asyncio.get_running_loop().time() + 60
        while not runner.done() and asyncio.get_running_loop().time() < deadline:
            peak.append(ctl.in_flight)
            await asyncio.sleep(0.005)
        if not runner.done():
            runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        await ctl.client.close()
        return runner
    try:
        runner = run_closing(ctl, go())
    finally:
        ctl.close()
        writer.close()
    assert not runner.cancelled(), "the rollout did not finish 2 groups of 2 at concurrency 1 within 60 s"
    assert max(peak) == 1 and len(ctl.buffer) == 4 and ctl.buffer.ready_groups() == 2


def test_a_stop_between_a_groups_episodes_keeps_the_rest_in_the_snapshot(server, random_model_dir, tmp_path):
    ctl, writer = make_controller(server, random_model_dir, tmp_path, harnesses=("tool_api_like",), concurrency=1,
                                  max_steps_per_trajectory=1)

    async def go():
        stop = asyncio.Event()
        runner = asyncio.create_task(ctl.run(stop))
        deadline = asyncio.get_running_loop().time() + 30
        while ctl.in_flight == 0 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.001)  # until the group's first episode runs; its second waits for a slot
        during = ctl.snapshot()
        stop.set()
        await asyncio.wait_for(runner, 60)
        await ctl.client.close()
        return during, ctl.snapshot()
    try:
        during, after = run_closing(ctl, go())
    finally:
        ctl.close()
        writer.close()
    group = during[0]["group_id"] if during else None
    assert [(d["group_id"], d["index"]) for d in during] == [(group, 0), (group, 1)]
    assert after == during[1:] and len(ctl.buffer) == 1  # the rest of the group runs first after a resume


def test_stale_groups_are_dropped_and_counted():
    buf = TrajectoryBuffer(capacity=16, max_staleness=2, group_size=2)

    async def go():
        for gid, version in (("old", 0), ("old", 1), ("fresh", 2), ("fresh", 3)):
            await buf.put(Episode(gid, record=None, version=version, reward=1.0))
        return await buf.take(2, current_version=3, timeout=0.1)
    groups = asyncio.run(go())
    assert [g[0].group_id for g in groups] == ["fresh"] and buf.counters["dropped_stale"] == 2


def test_sampler_resumes_at_the_same_position():
    tasks = {"a": load_tasks("terminal_like", "train"), "b": load_tasks("tool_api_like", "train")}
    s1 = TaskSampler(tasks, {"a": 2, "b": 1}, group_size=3, seed=11, curriculum=True)
    for _ in range(5):
        s1.next_group()
    s1.record(tasks["a"][0], True)
    state = s1.state_dict()
    expected = [[(d.task.task_id, d.seed) for d in s1.next_group()] for _ in range(5)]
    s2 = TaskSampler(tasks, {"a": 2, "b": 1}, group_size=3, seed=11, curriculum=True)
    s2.load_state_dict(state)
    assert [[(d.task.task_id, d.seed) for d in s2.next_group()] for _ in range(5)] == expected
    assert len({d.group_id for d in s2.next_group()}) == 1


def test_reward_service_down_masks_episodes_and_the_rollout_continues(server, random_model_dir, tmp_path):
    """docs/security.md row 24: bounded retries with backoff, then infra_error; episodes are masked, not zeroed."""
    from agentrl_cli.runtime.reward.client import HttpRewardClient
    from tests.conftest import free_port

    ctl, writer = make_controller(server, random_model_dir, tmp_path, harnesses=("tool_api_like",))
    ctl.reward = HttpRewardClient(f"http://127.0.0.1:{free_port()}", timeout_s=1.0, max_retries=2, backoff_s=0.01)

    async def go():
        await ctl.run(asyncio.Event(), max_groups=2)
        return await ctl.buffer.take(2, current_version=3, timeout=5)
    try:
        groups = run_closing(ctl, go())
    finally:
        ctl.close()
        writer.close()
    episodes = [e for g in groups for e in g]
    assert len(episodes) == 4 and all(e.reward is None for e in episodes)  # masked for the trainer
    assert ctl.counters["reward_infra_error"] == 4 and ctl.reward.counters["retries"] == 8
    assert {r.reward_status for r in read_records(writer.store)} == {"infra_error"}


def test_evaluation_runs_one_episode_at_a_time_under_a_limit_of_one(server, random_model_dir, tmp_path):
    ctl, writer = make_controller(server, random_model_dir, tmp_path, harnesses=("tool_api_like",), max_steps_per_trajectory=1)
    tasks = load_tasks("tool_api_like", "eval")[:4]
    live, peaks, play = [0], [], ctl.play

    async def counted(*args, **kw):
        live[0] += 1
        peaks.append(live[0])
        try:
            return await play(*args, **kw)
        finally:
            live[0] -= 1
    ctl.play = counted

    async def go():
        one = await ctl.evaluate(tasks, limit=asyncio.Semaphore(1))
        peak_one, peaks[:] = max(peaks), []
        free = await ctl.evaluate(tasks)
        await ctl.client.close()
        return one, peak_one, free, max(peaks)
    try:
        one, peak_one, free, peak_free = run_closing(ctl, go())
    finally:
        ctl.close()
        writer.close()
    assert peak_one == 1 and peak_free == 4
    assert one["n"] == free["n"] == 4 and one["errors"] == free["errors"] == 0
    assert one["by_family"].keys() == {t.meta["family"] for t in tasks}  # "wins/n" per task family
    counts = [tuple(map(int, v.split("/"))) for v in one["by_family"].values()]
    assert sum(n for _, n in counts) == 4 and sum(w for w, _ in counts) == one["success"]
    assert len(writer.store.list()) == 0  # evaluations are never stored
