"""`agentrl harness check`: a harness is checked against the contract without a model; the defaults
agentrl applies are listed; one episode is played (scripted where the harness ships solutions); a
harness missing a required member fails naming it."""

from __future__ import annotations

import shutil

import pytest

from harnesses.base import Observation

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")]


class SeedOnly:
    name, version = "seed_only", "0.1"

    def reset(self, task):
        return Observation(text=task.prompt)

    def step(self, action):
        return Observation(text="noted", done=True)

    def compute_reward(self, trajectory) -> float:
        return 0.5

    def close(self):
        pass


class Duel:
    """A competitive game with simultaneous moves, written from the docs alone (docs/multi-agent.md): both roles name a
    digit, the one closer to the task's target wins; no reward_source, no compute_reward."""

    name, version, roles, moves = "duel", "0.1", ("east", "west"), "simultaneous"

    def reset(self, task):
        self.target, self.submitted, self.result = int(task.answer), {}, None
        return self.observe("east")

    def to_move(self):
        return None if self.result else ("west" if "east" in self.submitted else "east")

    def observe(self, role):
        return Observation(text=f"{role}: name a digit closer to the target than your rival")

    def step(self, action):
        if not action.text.strip().isdigit():
            return Observation(text="one digit", status="invalid_action")
        self.submitted[self.to_move()] = int(action.text)
        if len(self.submitted) == 2:
            self.result = {r: abs(d - self.target) for r, d in self.submitted.items()}
        return Observation(text="noted", done=self.result is not None)

    def role_rewards(self, trajectory):
        if self.result is None:  # cut short before both moved
            return {"east": 0.0, "west": 0.0}
        east, west = self.result["east"], self.result["west"]
        return {"east": float(east < west), "west": float(west < east)}

    def scripted_move(self, role):
        return str(self.target if role == "east" else (self.target + 3) % 10)

    def close(self):
        pass


class ScoredDuel(Duel):
    def compute_reward(self, trajectory):
        return sum(self.role_rewards(trajectory).values())  # one winner: the total is 1 when the game is won


class NoStep:
    name, version = "no_step", "0.1"

    def reset(self, task):
        return Observation(text=task.prompt)

    def close(self):
        pass


def test_a_built_in_harness_passes_with_its_scripted_episode(cli):
    result, data = cli.json("harness", "check", "terminal_like")
    checks = {c["name"]: c for c in data["checks"]}
    assert result.exit_code == 0 and data["status"] == "pass"
    assert checks["one episode"]["measured"]["policy"] == "scripted" and checks["one episode"]["measured"]["reward"] == 1.0


def test_a_seed_contract_harness_shows_the_defaults_applied(cli, write_yaml, tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"task_id": "a", "prompt": "hi", "answer": "x", "split": "train"}\n')
    write_yaml(f"harnesses:\n  - name: '{__name__}:SeedOnly'\n    tasks: '{tasks}'\n    reward: harness\n")
    result, data = cli.json("harness", "check", f"{__name__}:SeedOnly")
    checks = {c["name"]: c for c in data["checks"]}
    assert result.exit_code == 0, checks
    assert set(checks["defaults applied"]["measured"]) == {"system_prompt", "tools", "evidence", "full_reset", "task_set",
                                                           "end_episode"}
    assert checks["reward source"]["measured"] == "harness"
    assert checks["one episode"]["measured"]["reward"] == 0.5 and checks["one episode"]["measured"]["policy"] == "plain actions"


def test_a_harness_missing_step_fails_naming_it(cli):
    result, data = cli.json("harness", "check", f"{__name__}:NoStep")
    assert result.exit_code == 1 and data["checks"][0]["detail"] == "missing step"


@pytest.mark.parametrize("cls, ok", [("Duel", False), ("ScoredDuel", True)])
def test_a_competitive_game_is_scored_by_its_roles_and_judged_by_its_own_episode_score(cli, write_yaml, tmp_path, cls, ok):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"task_id": "d", "prompt": "duel", "answer": "4", "split": "train"}\n')
    write_yaml(f"harnesses:\n  - name: '{__name__}:{cls}'\n    tasks: '{tasks}'\n")
    result, data = cli.json("harness", "check", f"{__name__}:{cls}")
    checks = {c["name"]: c for c in data["checks"]}
    assert checks["reward source"]["status"] == "pass" and checks["reward source"]["measured"] == "harness"
    roles = checks["roles"]
    assert roles["measured"]["mean_reward"] == {"east": 1.0, "west": 0.0} and roles["measured"]["moves"] == "simultaneous"
    assert (result.exit_code, roles["status"]) == ((0, "pass") if ok else (1, "fail"))
    if not ok:
        assert "the lowest role score" in roles["detail"] and "compute_reward" in roles["hint"]
