"""The multi-agent form of the harness contract (harnesses/multi_agent.py) and its built-in two-role
harness (guess_number): members required at load, seats, the game's rules and rewards, each role's
own view of the shared state, per-role GRPO groups and reward statistics, the schema's role columns
and the replay of a joint episode."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from agentrl_cli.runtime.data.local_store import LocalStore
from agentrl_cli.runtime.data.record_from_episode import record_from_episode
from agentrl_cli.runtime.data.replay import replay
from agentrl_cli.runtime.data.writer import TrajectoryWriter, read_records
from agentrl_cli.core.errors import ConfigError
from agentrl_cli.run.loop.samples import role_stats
from agentrl_cli.runtime.observe import keys
from agentrl_cli.core.outcomes import Outcome
from agentrl_cli.runtime.rollout.buffer import Episode
from agentrl_cli.learner.grpo import group_advantages
from harnesses.base import Action, Observation, Trajectory, missing_members
from harnesses.contract import play, scripted_policy
from harnesses.defaults import WithDefaults
from harnesses.guess_number import GuessNumber
from harnesses.multi_agent import combined_reward, play_scripted, role_group, roles_check, seats
from harnesses.registry import resolve

TASKS = GuessNumber.task_set().tasks


class RolesOnly:
    """A harness that declares roles but not the members they require."""

    name, version, roles = "roles_only", "0.1", ("a", "b")

    def reset(self, task):
        return Observation(text="hi")

    def step(self, action):
        return Observation(text="ok")

    def close(self):
        pass


def test_a_harness_with_roles_but_not_their_members_is_refused_at_load_naming_them():
    assert missing_members(RolesOnly) == ["to_move", "observe", "role_rewards"]
    with pytest.raises(ConfigError) as err:
        resolve(f"{__name__}:RolesOnly")
    assert "missing to_move, observe, role_rewards" in err.value.message and "harness contract 4" in err.value.message
    # a single-agent harness needs none of them (the same class without roles)
    assert missing_members(type("Plain", (RolesOnly,), {"roles": ()})) == []
    assert resolve("guess_number") is GuessNumber


def test_seats_default_to_the_policy_and_refuse_what_cannot_be_played():
    assert seats(GuessNumber, {}) == {"guesser": "policy", "holder": "policy"}
    assert seats(GuessNumber, {"holder": "http://127.0.0.1:9"}) == {"guesser": "policy", "holder": "http://127.0.0.1:9"}
    for assignment, words in (({"judge": "policy"}, "no role 'judge'"), ({"holder": "gpt"}, "seat 'gpt'"),
                              ({"guesser": "scripted", "holder": "scripted"}, "nothing would be trained")):
        with pytest.raises(ConfigError) as err:
            seats(GuessNumber, assignment)
        assert words in err.value.message
    with pytest.raises(ConfigError, match="no scripted_move"):
        seats(type("NoScript", (RolesOnly,), {}), {"a": "scripted"})
    with pytest.raises(ConfigError, match="has no roles"):
        seats(type("Plain", (RolesOnly,), {"roles": ()}), {"a": "policy"})


def test_the_scripted_game_scores_every_role_one_on_every_task():
    h = WithDefaults(GuessNumber)
    ok, measured, detail = roles_check(h, list(TASKS))
    assert ok, detail
    assert measured["mean_reward"] == {"guesser": 1.0, "holder": 1.0} and measured["tasks"] == len(TASKS) == 40
    # the joint scripted solution (the single-seat checks play it) is the roles' scripted moves, move by move
    for task in TASKS[::7]:
        joint, _ = play(h, task, policy=scripted_policy(h))
        by_role, acted, _ = play_scripted(h.inner, task)
        assert [a.text for a in joint.actions] == [a.text for a in by_role.actions]
        assert acted == ["guesser", "holder"] * (len(acted) // 2)


def test_only_the_holder_sees_the_secret_and_a_malformed_move_keeps_the_turn():
    task = next(t for t in TASKS if t.answer == 11 and t.meta["high"] == 16)
    h = GuessNumber()
    first = h.reset(task)
    assert h.to_move() == "guesser" and "11" not in first.text and first.text == h.observe("guesser").text
    bad = h.step(Action("I think it is eleven"))
    assert bad.status == "invalid_action" and not bad.done and h.to_move() == "guesser"
    assert "not valid" in h.observe("guesser").text and "not valid" not in h.observe("holder").text
    assert h.step(Action("GUESS: 99")).status == "invalid_action"  # outside 1..16
    assert h.step(Action("GUESS: 8")).status == "ok" and h.to_move() == "holder"
    holder_view = h.observe("holder").text
    assert "You hold the secret: 11." in holder_view and "guesses 8" in holder_view
    assert "11" not in h.observe("guesser").text
    assert h.step(Action("HIGHER or LOWER")).status == "invalid_action" and h.to_move() == "holder"
    assert h.step(Action("HIGHER")).status == "ok" and h.to_move() == "guesser"
    assert "Guess 1: 8 -> HIGHER" in h.observe("guesser").text


def test_a_lying_holder_loses_its_reward_and_a_false_correct_ends_the_game_unfound():
    task = next(t for t in TASKS if t.answer == 5 and t.meta["high"] == 8)
    h = GuessNumber()
    h.reset(task)
    for text in ("GUESS: 4", "LOWER", "GUESS: 2", "CORRECT"):  # both answers are lies
        obs = h.step(Action(text))
    assert obs.done and h.to_move() is None
    scores = h.role_rewards(Trajectory(task=task))
    assert scores["guesser"].score == 0.0 and scores["holder"].score == 0.0 and scores["holder"].flags == ["lied"]
    assert h.step(Action("GUESS: 5")).status == "invalid_action"  # the game is over
    h.reset(task)
    for text in ("GUESS: 4", "HIGHER", "GUESS: 6", "HIGHER"):  # one truthful answer of two
        h.step(Action(text))
    scores = h.role_rewards(Trajectory(task=task))
    assert scores["holder"].score == 0.5 and scores["guesser"].score == 0.0
    assert h.compute_reward(Trajectory(task=task)).score == 0.0  # the lowest role's
    assert combined_reward({"a": 1.0, "b": 0.25}).score == 0.25


def test_advantages_are_normalised_within_each_role_group():
    """Two draws' groups of a task: the guessers' rewards never shift the holders' advantages."""
    groups = [role_group("g1", "guesser")] * 2 + [role_group("g1", "holder")] * 2
    adv = group_advantages([1.0, 0.0, 0.5, 0.25], groups)
    assert groups[0] == "g1/guesser" and role_group("g1", None) == "g1"
    assert adv[0] == -adv[1] and adv[2] == -adv[3] and adv[2] > 0 and adv[0] == pytest.approx(adv[2], rel=1e-4)
    mixed = group_advantages([1.0, 0.0, 0.5, 0.25], ["g1"] * 4)  # without the role in the key the holders' shift
    assert mixed[2] < 0.5 * adv[2]


def test_the_batch_reports_each_roles_rewards():
    def ep(role, reward, outcome=Outcome.FAIL):
        return Episode(role_group("g", role), SimpleNamespace(role=role, outcome=outcome), 0, reward)
    eps = [ep("guesser", 1.0, Outcome.SUCCESS), ep("guesser", 0.0), ep("holder", 0.5), ep("holder", None)]
    stats = role_stats(eps, [e.reward for e in eps])
    assert stats[keys.reward_role("guesser")] == 0.5 and stats[keys.reward_role("guesser", "success_rate")] == 0.5
    assert stats[keys.reward_role("holder")] == 0.5 and stats[keys.reward_role("holder", "episodes")] == 2
    assert role_stats([Episode("g", SimpleNamespace(role=None, outcome=Outcome.FAIL), 0, 1.0)], [1.0]) == {}


def _joint_record(task, role="holder"):
    h = GuessNumber()
    traj, acted, _ = play_scripted(h, task)
    return record_from_episode(traj, run_id="r", harness_version=h.version, trajectory_id=f"r-g0-0-{role}",
                               task_set_version=GuessNumber.task_set().version, group_id=role_group("g0", role),
                               role=role, step_roles=acted)


def test_a_stored_joint_episode_reads_back_with_its_roles_and_replays_without_divergence(tmp_path):
    task = TASKS[9]
    store = LocalStore(tmp_path / "store")
    with TrajectoryWriter(store) as w:
        assert w.write(_joint_record(task))
    (back,) = read_records(store)
    assert back.role == "holder" and back.group_id == "g0/holder" and back.schema_version == 4
    assert [s.role for s in back.steps] == ["guesser", "holder"] * (len(back.steps) // 2)
    report = replay(back)
    assert report.ok and report.steps_compared == len(back.steps) and report.to_dict()["role"] == "holder"
    # the move given to the wrong role, or a different reply, is the first divergence
    swapped = _joint_record(task)
    swapped.steps[1].role = "guesser"
    d = replay(swapped).divergence
    assert (d.step, d.field, d.recorded, d.replayed) == (1, "role", "guesser", "holder")
    changed = _joint_record(task)
    changed.steps[1].action = "LOWER" if changed.steps[1].action != "LOWER" else "HIGHER"
    d = replay(changed).divergence
    assert d.step == 1 and d.field == "text" and "answered" in d.diff


def test_a_store_the_version_2_writer_wrote_still_reads_beside_role_records(tmp_path):
    """tests/golden/trajectory_store_v2: written by the schema 2 writer, before the role columns."""
    import shutil
    from pathlib import Path

    store = LocalStore(tmp_path / "v2")
    shutil.copytree(Path(__file__).resolve().parents[1] / "golden" / "trajectory_store_v2", store.root)
    with TrajectoryWriter(store) as w:
        assert w.write(_joint_record(TASKS[0]))
    records = {r.trajectory_id: r for r in read_records(store)}
    old, new = records["golden-v2-train-g0-0"], records["r-g0-0-holder"]
    assert (old.schema_version, old.role, old.steps[0].role) == (2, None, None)
    assert old.steps[0].tool_calls[0].output == "3\n" and old.token_ids == [1, 2, 3, 4]
    assert (new.schema_version, new.role, new.steps[0].role) == (4, "holder", "guesser")


def test_harness_check_plays_every_role():
    from agentrl_cli.config import load_config
    from harnesses.checkup import check_harness

    cfg = load_config(None, env={}).config
    roles = next(c for c in check_harness("guess_number", cfg) if c.name == "roles")
    assert roles.status == "pass" and roles.measured["seats"] == {"guesser": "policy", "holder": "policy"}
    assert roles.measured["mean_reward"] == {"guesser": 1.0, "holder": 1.0}


def _play_seated(harness, task, max_steps: int = 40):
    """run_multi_episode with every role scripted (no model: the loop, rewards and errors alone)."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from agentrl_cli.runtime.rollout.multi_episode import Seat, run_multi_episode

    with ThreadPoolExecutor(2) as pool:
        return asyncio.run(run_multi_episode(harness, task, {r: Seat(r, "scripted") for r in harness.roles}, None, pool,
                                             max_steps=max_steps, step_timeout_s=10, max_new_tokens=8))


def test_the_episode_loop_gives_each_move_to_the_role_the_harness_names_and_scores_every_role():
    task = TASKS[20]
    played = _play_seated(GuessNumber(), task)
    assert played.termination == "done" and played.harness_error is None
    assert played.step_roles == ["guesser", "holder"] * (len(played.step_roles) // 2)
    assert {r: s.score for r, s in played.role_rewards.items()} == {"guesser": 1.0, "holder": 1.0}
    assert played.evidence.final_answer == str(task.answer)
    cut = _play_seated(GuessNumber(), task, max_steps=1)
    assert cut.termination == "truncated" and cut.step_roles == ["guesser"] and cut.role_rewards["holder"].score == 0.0


class BrokenRewards(GuessNumber):
    def role_rewards(self, trajectory):
        return {"guesser": 1.0}  # the holder is not scored


class BrokenTurn(GuessNumber):
    def to_move(self):
        raise RuntimeError("lost track of turns")


def test_a_harness_failing_its_multi_agent_members_ends_the_episode_infra_error_naming_the_method():
    missing = _play_seated(BrokenRewards(), TASKS[0])
    assert missing.termination == "infra_error" and missing.harness_error[0] == "role_rewards"
    assert "no score for role holder" in missing.error
    turn = _play_seated(BrokenTurn(), TASKS[0])
    assert turn.termination == "infra_error" and turn.harness_error[0] == "to_move" and "lost track" in turn.error


class RockPaperScissors:
    """Simultaneous moves: each round `a` then `b` submit, the round is applied when `b` has, so `b`
    never sees `a`'s move of the same round."""

    name, version, roles, moves = "rps", "0.1", ("a", "b"), "simultaneous"
    BEATS = {"rock": "scissors", "paper": "rock", "scissors": "paper"}

    def reset(self, task):
        self.rounds, self.submitted = [], {}
        return self.observe("a")

    def to_move(self):
        return None if len(self.rounds) == 2 else ("b" if "a" in self.submitted else "a")

    def observe(self, role):
        return Observation(text=f"{role}: rounds so far {self.rounds}")

    def step(self, action):
        role = self.to_move()
        if action.text not in self.BEATS:
            return Observation(text="rock, paper or scissors", status="invalid_action")
        self.submitted[role] = action.text
        if role == "b":
            self.rounds.append((self.submitted.pop("a"), self.submitted.pop("b")))
        return Observation(text="submitted", done=len(self.rounds) == 2)

    def scripted_move(self, role):
        return "rock" if role == "a" else "paper"

    def role_rewards(self, trajectory):
        wins = {r: sum(self.BEATS[mine] == theirs for mine, theirs in (rnd if r == "a" else rnd[::-1] for rnd in self.rounds))
                for r in self.roles}
        return {r: w / len(self.rounds) for r, w in wins.items()}

    def close(self):
        pass


def test_simultaneous_moves_hide_a_rounds_moves_until_every_role_has_submitted():
    assert missing_members(RockPaperScissors) == [] and seats(RockPaperScissors, {}) == {"a": "policy", "b": "policy"}
    h = RockPaperScissors()
    h.reset(TASKS[0])
    h.step(Action("scissors"))
    assert h.to_move() == "b" and "scissors" not in h.observe("b").text
    played = _play_seated(RockPaperScissors(), TASKS[0])
    assert played.termination == "done" and played.step_roles == ["a", "b", "a", "b"]
    assert {r: s.score for r, s in played.role_rewards.items()} == {"a": 0.0, "b": 1.0}


class ScoredRockPaperScissors(RockPaperScissors):
    def compute_reward(self, trajectory):
        return sum(self.role_rewards(trajectory).values())  # one winner a round: the roles' total is 1 when every round is won


def test_a_competitive_game_is_judged_by_its_own_episode_score_and_defaults_to_the_lowest_role_score():
    task = TASKS[0]
    ok, measured, detail = roles_check(WithDefaults(RockPaperScissors), [task])
    assert not ok and measured["mean_reward"] == {"a": 0.0, "b": 1.0} and measured["episode_reward"] == 0.0
    assert "the lowest role score" in detail and "compute_reward" in detail
    ok, measured, detail = roles_check(WithDefaults(ScoredRockPaperScissors), [task])
    assert ok and measured["episode_reward"] == 1.0, detail
    h = WithDefaults(RockPaperScissors)  # no compute_reward of its own: the default is combined_reward
    traj, _, _ = play_scripted(h.inner, task)
    assert h.has_reward() and h.harness_reward(traj).score == 0.0 and "b 1" in h.harness_reward(traj).detail


def test_a_multi_agent_harness_is_scored_by_its_roles_unless_told_otherwise():
    from agentrl_cli.config.models import HarnessConfig
    from harnesses.configured import check_configured
    from harnesses.registry import reward_source

    name = f"{__name__}:RockPaperScissors"
    assert reward_source(HarnessConfig(name=name)) == "harness"  # no reward_source, no compute_reward
    assert reward_source(HarnessConfig(name=f"{__name__}:GuessNumber")) == "harness"
    for source in ("verifiers", "mix"):
        config = type("Cfg", (), {"harnesses": [HarnessConfig(name=name, reward=source)]})()
        with pytest.raises(ConfigError, match=f"reward source is {source}"):
            check_configured(config)
