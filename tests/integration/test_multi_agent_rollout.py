"""A two-role harness (guess_number) through the rollout against real embedded inference servers
(random tiny models): self-play plays, scores, stores and buffers one trajectory per role in that
role's GRPO group, each role's tokens hold only what that role was shown and its own generations,
and every stored episode replays without divergence; a fixed opponent served by a second server
plays its role and is never recorded as a trained sequence."""

from __future__ import annotations

import asyncio

import pytest
from transformers import AutoTokenizer

from agentrl_cli.config import load_config
from agentrl_cli.config.load import with_overrides
from agentrl_cli.runtime.data.local_store import LocalStore
from agentrl_cli.runtime.data.replay import replay
from agentrl_cli.runtime.data.writer import TrajectoryWriter, read_records
from agentrl_cli.engines.inference.client import InferenceClient
from agentrl_cli.runtime.reward.client import LocalRewardClient
from agentrl_cli.runtime.reward.scorer import Scorer
from agentrl_cli.runtime.rollout.buffer import TrajectoryBuffer
from agentrl_cli.runtime.rollout.controller import RolloutController
from agentrl_cli.runtime.rollout.sampler import Draw, TaskSampler
from harnesses.guess_number import GuessNumber

pytestmark = [pytest.mark.integration]


def controller(server_url: str, model_dir, tmp_path, roles: dict | None = None):
    cfg = load_config(None, ["rollout.concurrency=4", "rollout.group_size=2", "rollout.max_steps_per_trajectory=3",
                             "rollout.buffer_size=16", "inference.max_new_tokens=8"], env={}).config
    cfg = with_overrides(cfg, {"harnesses": [{"name": "guess_number", "roles": roles or {}}]}, "test")
    sampler = TaskSampler({"guess_number": list(GuessNumber.task_set().select("train"))}, group_size=2, seed=7)
    writer = TrajectoryWriter(LocalStore(tmp_path / "store"))
    ctl = RolloutController(cfg, InferenceClient(server_url), AutoTokenizer.from_pretrained(model_dir),
                            LocalRewardClient(Scorer()), sampler, TrajectoryBuffer(16, 2, 2), run_id="ma", writer=writer)
    return cfg, ctl, writer


def roll(ctl, writer, groups: int, answered: dict | None = None):
    """Run `groups` draws; `answered`: filled with the /generate requests each server answered (url -> n)."""
    async def go():
        try:
            await ctl.run(asyncio.Event(), max_groups=groups)
            taken = await ctl.buffer.take(2 * groups, current_version=3, timeout=5)
            for client in [ctl.client, *ctl.seating.opponents.values()]:
                for url, n in client.answered.items():
                    (answered if answered is not None else {})[url] = n
            await ctl.seating.aclose()
            return taken
        finally:
            await ctl.client.close()
    try:
        return asyncio.run(go())
    finally:
        ctl.close()
        writer.close()


def test_self_play_stores_and_buffers_one_trajectory_per_role_that_replays(server, random_model_dir, tmp_path):
    cfg, ctl, writer = controller(server.url, random_model_dir, tmp_path)
    groups = roll(ctl, writer, 1)
    # per-role GRPO groups: the draw's group split by role, group_size episodes each
    assert sorted(g[0].group_id.rsplit("/", 1)[1] for g in groups) == ["guesser", "holder"]
    assert all(len(g) == 2 and len({e.group_id for e in g}) == 1 and {e.record.role for e in g} == {g[0].group_id.rsplit("/")[1]}
               for g in groups)
    records = read_records(writer.store)
    assert len(records) == 4 and {r.role for r in records} == {"guesser", "holder"}
    tok = ctl.tokenizer
    for r in records:
        mover = [s.role for s in r.steps]
        assert set(mover) <= {"guesser", "holder"} and mover[0] == "guesser"
        own = sum(m == r.role for m in mover)
        assert int(sum(r.loss_mask)) == r.completion_tokens and (r.completion_tokens > 0) == (own > 0)
        if r.role == "guesser":  # the hidden number is in the holder's observations only
            assert "You hold the secret" not in tok.decode(r.token_ids)
            assert len([v for s in r.steps if (v := s.weight_version)]) == own
        report = replay(r, platform_config=cfg)
        assert report.ok and report.steps_compared == len(r.steps), report.to_dict()
    # a role that never got the turn (the random guesser never made a valid guess) is masked, not scored 0
    never = [e for g in groups for e in g if e.record.completion_tokens == 0]
    assert all(e.reward is None for e in never) and ctl.counters["roles_without_moves"] == len(never)


@pytest.fixture(scope="module")
def opponent(random_model_dir):
    """A second embedded server: the fixed opponent, a model the run never trains."""
    from agentrl_cli.engines.inference.engine import HFEngine
    from agentrl_cli.engines.inference.hf_server import create_app
    from agentrl_cli.core.serving import ServerThread

    engine = HFEngine(random_model_dir, batch_window_ms=5, weight_version="opponent")
    srv = ServerThread(create_app(engine), name="opponent").start()
    yield srv
    srv.stop()
    engine.close()


def test_a_fixed_opponent_plays_its_role_from_its_own_server_and_is_never_trained(server, opponent, random_model_dir, tmp_path):
    cfg, ctl, writer = controller(server.url, random_model_dir, tmp_path, roles={"guesser": opponent.url})
    answered: dict = {}
    groups = roll(ctl, writer, 1, answered)
    assert {e.record.role for g in groups for e in g} <= {"holder"}  # the only group the policy fills
    records = read_records(writer.store)
    assert {r.role for r in records} == {"holder"} and len(records) == 2
    for r in records:
        assert r.steps[0].role == "guesser"
        assert all(s.weight_version == "" for s in r.steps if s.role == "guesser")  # not the policy's tokens
        assert r.completion_tokens == int(sum(r.loss_mask))  # the holder's own generations only
        assert replay(r, platform_config=cfg).ok
    moves = {role: sum(s.role == role for r in records for s in r.steps) for role in ("guesser", "holder")}
    assert moves["guesser"] >= 2  # every episode starts with the opponent's move
    # every guesser move was generated by the opponent's server, every holder move by the policy's
    assert answered.get(opponent.url.rstrip("/"), 0) == moves["guesser"]
    assert answered.get(server.url.rstrip("/"), 0) == moves["holder"]
    assert ctl.seating.opponents == {}  # closed


def test_a_multi_agent_episode_refused_at_capacity_is_waited_out_and_played_counting_backpressure(server, random_model_dir):
    from tests.unit.test_multi_agent_env_busy import BusyGuess
    from tests.unit.test_multi_agent_env_busy import controller as busy_controller

    ctl = busy_controller({"holder": "scripted"}, 60, InferenceClient(server.url), AutoTokenizer.from_pretrained(random_model_dir))
    BusyGuess.refusals = 2

    async def go():
        try:
            return await ctl.play_roles(Draw(GuessNumber.task_set().select("train")[0], "g0", 0, 0))
        finally:
            await ctl.client.close()
    try:
        [guesser] = asyncio.run(go())
    finally:
        ctl.close()
    assert guesser.role == "guesser" and not guesser.scored.masked and guesser.result.completion_tokens > 0
    assert ctl.counters["env/guess_number/backpressure"] == 2 and ctl.counters["env/guess_number/capacity"] == 1
    assert ctl.counters["termination_infra_error"] == 0 and not any("harness_error" in k for k in ctl.counters)
