"""The multi-agent form of the harness contract (contract 4): several agents in one environment.

A multi-agent harness is a harness (`harnesses.base`: name, version, reset, step, close) that
declares `roles`. Its episode is one environment whose shared state every role observes through
its own observations; the roles move in the order the harness gives (`to_move`), or
simultaneously (`moves = "simultaneous"`: each role of a round submits in turn, and the harness
applies the round when the last one has, so no role sees another's move of the same round).

Required of a harness that declares `roles` (`base.MULTI_AGENT_MEMBERS`; a harness lacking one is
refused at load, naming it):
  roles (class attribute) tuple[str, ...]  the role names, e.g. ("guesser", "holder")
  to_move() -> str | None   the role whose move the next `step(action)` is; None when the episode is over
  observe(role) -> Observation  everything `role` is shown before its next move: its view of the
                            shared state, the result of its own last move included
  role_rewards(trajectory) -> dict[str, float | HarnessReward]  each role's score in [0, 1], called
                            right after the episode while its state is alive

The single-agent members keep their meaning, so every check of a harness applies unchanged:
`reset(task)` returns the first mover's observation, `step(action)` applies the move of the role
`to_move()` named and returns that role's result (`invalid_action`: not applied, the same role
moves again), `done` ends the episode for every role. The training reward of each role is its
`role_rewards` score (reward source `harness`, the default for a harness with roles; `verifiers`
and `mix` are refused). `compute_reward` (what the scripted-episode checks judge) defaults to
`combined_reward`, the lowest role score: a game where roles compete defines it (e.g. the roles'
total), as a competitive game's lowest score is 0 however well both play.

Optional, with defaults:
  moves (class attribute)   "turns" (default) | "simultaneous"
  role_prompt(role) -> str  the system prompt of `role`'s conversation; default system_prompt()
  scripted_move(role) -> str | None  the move a competent player of `role` makes now; what a role
                            seated `scripted` plays (default: none, and `scripted` seats are refused)
  scripted_action(task, turn) (classmethod)  as for any harness: the joint scripted episode, move
                            by move (the contract checks and stage 5 play it)

Who plays each role is configuration (`harnesses[].roles`, role -> seat; `seats`): `policy` (the
policy under training: self-play when several roles are), `scripted` (the harness's scripted_move),
or the URL of an inference server with the policy's tokenizer (a fixed opponent model; its tokens
are never trained). Each policy role is trained on its own conversation, scored by its own reward,
and grouped for GRPO by (task draw, role) (`role_group`).

Belongs here: the contract's multi-agent members, seats, and the scripted play of a whole episode.
Not here: playing an episode with models (`agentrl_cli.runtime.rollout.multi_episode`). A model-played
role's conversation offers the harness's `tools()`, and its move reaches `step` as a single-agent
turn does: the text and the tool calls parsed from it (`Action.tool_calls`); a scripted move is its
text alone, as in `play_scripted`.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from agentrl_cli.core.errors import ConfigError
from harnesses.base import MULTI_AGENT_MEMBERS, Action, HarnessReward, Observation, TaskSpec, Trajectory

POLICY, SCRIPTED = "policy", "scripted"
MOVES = ("turns", "simultaneous")

__all__ = ["MOVES", "MULTI_AGENT_MEMBERS", "MultiAgentHarness", "POLICY", "ROLES_EXPECTED", "ROLES_HINT", "SCRIPTED",
           "combined_reward", "episode_reward", "is_multi_agent", "play_scripted", "policy_roles", "require_harness_reward",
           "role_group", "role_prompt", "roles_check", "scripted_conversations", "seats"]


@runtime_checkable
class MultiAgentHarness(Protocol):
    name: str
    version: str
    roles: tuple[str, ...]

    def reset(self, task_spec: TaskSpec) -> Observation: ...
    def step(self, action: Action) -> Observation: ...
    def to_move(self) -> str | None: ...
    def observe(self, role: str) -> Observation: ...
    def role_rewards(self, trajectory: Trajectory) -> dict: ...
    def close(self) -> None: ...


def is_multi_agent(harness) -> bool:
    """Whether a harness class or instance (a `WithDefaults` too) declares roles."""
    harness = getattr(harness, "inner", harness)
    return bool(getattr(harness, "roles", None))


def role_prompt(harness, role: str) -> str:
    """The system prompt of `role`'s conversation: the harness's role_prompt, else its system_prompt, else ""."""
    if hasattr(harness, "role_prompt"):
        return harness.role_prompt(role)
    return harness.system_prompt() if hasattr(harness, "system_prompt") else ""


def seats(cls: type, assignment: dict | None, name: str = "") -> dict[str, str]:
    """Role -> seat (`policy`, `scripted` or an inference server URL) for every role of `cls`, from
    `harnesses[].roles` (a role it does not name: `policy`). ConfigError naming what is wrong: a role
    the harness does not have, a seat that is none of the three, `scripted` without scripted_move,
    no role left to the policy (nothing to train)."""
    name = name or getattr(cls, "name", cls.__name__)
    roles = tuple(getattr(cls, "roles", ()) or ())
    assignment = dict(assignment or {})
    if not roles:
        if assignment:
            raise ConfigError(f"harness {name!r} has no roles, but harnesses[].roles names {', '.join(sorted(assignment))}",
                              "remove harnesses[].roles: it applies to multi-agent harnesses only")
        return {}
    moves = getattr(cls, "moves", "turns")
    if moves not in MOVES:
        raise ConfigError(f"harness {name!r}: moves {moves!r} is not one of {', '.join(MOVES)}", "fix the class's moves attribute")
    unknown = sorted(set(assignment) - set(roles))
    if unknown:
        raise ConfigError(f"harness {name!r} has no role {', '.join(map(repr, unknown))}; its roles: {', '.join(roles)}",
                          "name only the harness's roles in harnesses[].roles")
    out = {}
    for role in roles:
        seat = str(assignment.get(role, POLICY))
        if seat not in (POLICY, SCRIPTED) and not seat.startswith(("http://", "https://")):
            raise ConfigError(f"harness {name!r}: role {role!r} has seat {seat!r}",
                              "use policy, scripted, or the URL of an inference server (http://HOST:PORT) for a fixed opponent")
        if seat == SCRIPTED and not hasattr(cls, "scripted_move"):
            raise ConfigError(f"harness {name!r}: role {role!r} is seated scripted, but the harness defines no scripted_move",
                              "seat the role policy or at an inference server URL, or define scripted_move(role)")
        out[role] = seat
    if POLICY not in out.values():
        raise ConfigError(f"harness {name!r}: no role is played by the policy ({out}), so nothing would be trained",
                          "seat at least one role `policy` in harnesses[].roles")
    return out


def require_harness_reward(name: str, source: str) -> None:
    """A multi-agent harness is scored by its role_rewards only: harnesses[].reward must be `harness`
    (ConfigError naming the source otherwise)."""
    if source != "harness":
        raise ConfigError(f"harness {name!r} has roles, scored by its role_rewards, but its reward source is {source}",
                          f"set harnesses[].reward: harness for {name} (or leave it unset)")


def policy_roles(seated: dict[str, str]) -> list[str]:
    """The roles the policy under training plays, in the harness's order."""
    return [r for r, s in seated.items() if s == POLICY]


def role_group(group_id: str, role: str | None) -> str:
    """The GRPO group of one role's samples of a task draw: the draw's group and the role."""
    return group_id if not role else f"{group_id}/{role}"


def combined_reward(scores: dict) -> HarnessReward:
    """One score for the whole episode: the lowest role score, every role's flags, each role's score as detail."""
    rewards = {r: HarnessReward.of(v) for r, v in scores.items()}
    if not rewards:
        return HarnessReward(0.0, [], "no role scored")
    return HarnessReward(min(r.score for r in rewards.values()), sorted({f for r in rewards.values() for f in r.flags}),
                         ", ".join(f"{role} {r.score:g}" for role, r in rewards.items()))


def episode_reward(harness, trajectory: Trajectory) -> HarnessReward:
    """One score for a whole episode (what the scripted-episode checks judge): the harness's own
    compute_reward where it defines one, else, for a multi-agent harness, `combined_reward` of its
    role_rewards. A game where roles compete defines compute_reward (e.g. the roles' total), as its
    lowest role score is 0 however well both play."""
    if hasattr(harness, "compute_reward"):
        return HarnessReward.of(harness.compute_reward(trajectory))
    return combined_reward(harness.role_rewards(trajectory))


def play_scripted(harness, task: TaskSpec, max_turns: int = 40) -> tuple[Trajectory, list[str], Observation]:
    """One episode with every role played by the harness's `scripted_move`; returns the joint
    trajectory, the role of each step and the last observation."""
    traj = Trajectory(task=task)
    obs = harness.reset(task)
    traj.observations.append(obs)
    acted: list[str] = []
    for _ in range(max_turns):
        role = harness.to_move()
        if role is None:
            break
        text = harness.scripted_move(role)
        if text is None:
            break
        action = Action(text=text)
        obs = harness.step(action)
        traj.actions.append(action)
        traj.observations.append(obs)
        acted.append(role)
        if obs.done:
            break
    return traj, acted, obs


def scripted_conversations(harness, task: TaskSpec, max_turns: int = 40) -> dict[str, list[dict]]:
    """Each role's conversation in one episode played by `scripted_move`, as the rollout shows it to
    a role a model plays (`agentrl_cli.runtime.rollout.multi_episode`): the system prompt `role_prompt(role)`
    (the harness's tools go beside it, as the rollout offers them), its view when it first moves (`observe(role)`) as the user turn, then its move (assistant) and,
    before each later move of it, its view then (tool); it ends on its last move. A role that never
    moved has no conversation."""
    out: dict[str, list[dict]] = {}
    harness.reset(task)
    for _ in range(max_turns):
        role = harness.to_move()
        if role is None:
            break
        view = harness.observe(role).text
        text = harness.scripted_move(role)
        if text is None:
            break
        if role in out:
            out[role].append({"role": "tool", "content": view})
        else:
            out[role] = [{"role": "system", "content": role_prompt(harness, role)}, {"role": "user", "content": view}]
        out[role].append({"role": "assistant", "content": text})
        if harness.step(Action(text=text)).done:
            break
    return out


ROLES_EXPECTED = "in scripted play every role moves and is scored in [0, 1], and the episode earns 1.0"
ROLES_HINT = ("fix the harness's to_move, observe, scripted_move or role_rewards (harnesses/multi_agent.py); "
              "in a game where roles compete, define compute_reward(trajectory) for what a scripted episode earns")


def roles_check(harness, tasks: list[TaskSpec]) -> tuple[bool, dict, str]:
    """In the scripted play of each task (`play_scripted`): every role moves, every role is scored in
    [0, 1], every role has a view of the shared state (`observe`), and the episode earns 1.0
    (`episode_reward`: compute_reward, else the lowest role score). Returns (ok, measured, what failed)."""
    inner = getattr(harness, "inner", harness)
    roles = tuple(getattr(inner, "roles", ()))
    if not hasattr(harness, "scripted_move"):
        return False, {"roles": list(roles)}, "the harness defines no scripted_move to play its roles with"
    bad, means, episodes = [], {r: [] for r in roles}, []
    for task in tasks:
        traj, acted, _ = play_scripted(harness, task)
        scores = {r: HarnessReward.of(v).score for r, v in harness.role_rewards(traj).items()}
        episode = episode_reward(inner, traj).score
        episodes.append(episode)
        views = {r: harness.observe(r) for r in roles}
        for r in roles:
            means[r].append(scores.get(r, 0.0))
        if set(acted) != set(roles) or set(scores) != set(roles) or not all(0.0 <= v <= 1.0 for v in scores.values()):
            bad.append(f"{task.task_id}: moved {sorted(set(acted))}, scored {scores} (every role must move and score in [0, 1])")
        elif not all(isinstance(v, Observation) for v in views.values()):
            bad.append(f"{task.task_id}: observe(role) did not return an Observation")
        elif episode != 1.0:
            own = "compute_reward" if hasattr(inner, "compute_reward") else \
                "the lowest role score (a game where roles compete defines compute_reward, e.g. the roles' total)"
            bad.append(f"{task.task_id}: the scripted episode earned {episode:g} by {own}; role scores {scores}")
    measured = {"roles": list(roles), "moves": getattr(inner, "moves", "turns"), "tasks": len(tasks),
                "mean_reward": {r: round(sum(v) / max(1, len(v)), 3) for r, v in means.items()},
                "episode_reward": round(sum(episodes) / max(1, len(episodes)), 3)}
    return not bad and bool(tasks), measured, "; ".join(bad[:3])
