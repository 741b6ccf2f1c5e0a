"""Replay: 20 recorded trajectories from each built-in harness, written to the store and read back,
replay with no divergence; an injected change to a harness's behaviour is reported at the step
where it first shows, with a diff; a version mismatch refuses to replay."""

from __future__ import annotations

import random

import pytest

from agentrl_cli.runtime.data.record_from_episode import record_from_episode
from agentrl_cli.runtime.data.replay import replay
from agentrl_cli.runtime.data.local_store import LocalStore
from agentrl_cli.runtime.data.writer import TrajectoryWriter, find_trajectory, read_records
from harnesses.contract import play
from harnesses.oracle import oracle_action
from harnesses.registry import resolve
from harnesses.tasks import TASK_SET_VERSION, load_tasks
from harnesses.terminal_like import TerminalLike
from tests.integration.conftest import needs_bwrap

pytestmark = [pytest.mark.integration, needs_bwrap]
HARNESSES = ("terminal_like", "code_sandbox_like", "tool_api_like")
NOISE = ("hello", "<tool_call>{oops</tool_call>", '<tool_call>{"name": "nope", "arguments": {}}</tool_call>')


def noisy_policy(seed: int):
    """The scripted solution with an invalid action slipped in at a seeded turn (so episodes differ)."""
    rng = random.Random(seed)
    slip = rng.randrange(0, 3)
    noise = rng.choice(NOISE)

    def policy(task, turn):
        if turn == slip:
            return noise
        return oracle_action(task, turn - (turn > slip))
    return policy


def record(harness, task, seed: int, run_id: str = "replay-test"):
    traj, _ = play(harness, task, policy=noisy_policy(seed))
    return record_from_episode(traj, run_id=run_id, harness_version=harness.version, seed=seed,
                               task_set_version=TASK_SET_VERSION, evidence=harness.evidence(traj))


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    store = LocalStore(tmp_path_factory.mktemp("store"))
    ids: dict[str, list[str]] = {}
    with TrajectoryWriter(store, rows_per_file=64) as writer:
        for name in HARNESSES:
            h = resolve(name)()
            try:
                tasks = load_tasks(name, "train")
                for i in range(20):
                    rec = record(h, tasks[(i * 7) % len(tasks)], seed=i)
                    assert writer.write(rec)
                    ids.setdefault(name, []).append(rec.trajectory_id)
            finally:
                h.close()
    return store, ids


@pytest.mark.parametrize("name", HARNESSES)
def test_twenty_recorded_trajectories_replay_without_divergence(name, stored):
    store, ids = stored
    records = [r for r in read_records(store) if r.harness == name]
    assert sorted(r.trajectory_id for r in records) == sorted(ids[name])
    assert any(s.observation_status == "invalid_action" for r in records for s in r.steps)  # the noise is recorded
    for rec in records:
        report = replay(rec)
        assert report.ok, report.to_dict()
        assert report.steps_compared == len(rec.steps) >= 2


class DriftingTerminal(TerminalLike):
    """terminal_like whose shell output changes from the second command on (a behaviour change)."""

    def reset(self, task_spec):
        self.calls = 0
        return super().reset(task_spec)

    def tool_run_shell(self, arguments):
        self.calls += 1
        obs = super().tool_run_shell(arguments)
        if self.calls >= 2:
            obs.text = obs.text.replace("[exit code", "[drift]\n[exit code")
        return obs


def test_an_injected_change_is_reported_at_the_step_where_it_shows(stored):
    store, ids = stored
    task = load_tasks("terminal_like", "train", "count_matches")[0]
    h = resolve("terminal_like")()
    try:
        traj, _ = play(h, task, policy=lambda t, turn: {0: oracle_action(t, 0), 1: oracle_action(t, 0),
                                                        2: oracle_action(t, 1)}.get(turn))
        rec = record_from_episode(traj, run_id="r", harness_version=h.version, task_set_version=TASK_SET_VERSION)
    finally:
        h.close()
    drifting = DriftingTerminal()
    try:
        report = replay(rec, harness=drifting)
    finally:
        drifting.close()
    d = report.divergence
    assert d is not None and (d.step, d.field) == (1, "text") and report.steps_compared == 2
    assert "+[drift]" in d.diff and d.diff.startswith("--- recorded/step1")
    fetched = find_trajectory(store, ids["terminal_like"][0])
    assert fetched is not None and replay(fetched).ok


def test_a_different_harness_version_refuses_to_replay(stored):
    store, ids = stored
    rec = find_trajectory(store, ids["tool_api_like"][3])
    rec.harness_version = "0.9"
    report = replay(rec)
    assert not report.ok and report.divergence.field == "version" and "install the recorded version" in report.divergence.diff


def test_a_harness_with_its_own_task_file_replays_through_the_config_and_an_agent_episode_is_refused(tmp_path):
    import json

    from agentrl_cli.config import load_config
    from agentrl_cli.core.errors import NotFoundError, UsageError
    from harnesses.task_sources import task_set

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"task_id": "own/1", "prompt": "Compute 2 + 2.", "answer": "4", "split": "train"}) + "\n")
    entry = json.dumps([{"name": "terminal_like", "tasks": str(tasks)}])
    cfg = load_config(None, [f"harnesses={entry}"], env={}).config
    task = task_set(cfg.harnesses[0], cfg.data).tasks[0]
    harness = resolve("terminal_like")()
    try:
        traj, _ = play(harness, task, policy=lambda t, turn: ("ANSWER: 4",)[turn] if turn < 1 else None)
    finally:
        harness.close()
    rec = record_from_episode(traj, run_id="own", harness_version=TerminalLike.version, reward=None, evidence=None,
                              termination="done", seed=0, task_set_version=task_set(cfg.harnesses[0], cfg.data).version)
    assert replay(rec, platform_config=cfg).ok  # the task comes from the configured file, not the committed set
    with pytest.raises(NotFoundError, match="not in the terminal_like task set"):
        replay(rec.__class__(**{**rec.__dict__, "task_id": "own/404"}), platform_config=cfg)
    with pytest.raises(UsageError, match="cannot replay them"):
        replay(rec.__class__(**{**rec.__dict__, "harness": "agent"}), platform_config=cfg)
