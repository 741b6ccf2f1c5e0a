"""The rollout controller's side of multi-agent harnesses (`harnesses.multi_agent`): who plays each
role (`Seating`, from `harnesses[].roles`), and `play_roles`, which plays one episode
(`multi_episode.run_multi_episode`) and scores, records and stores it once per role the policy plays.

Each policy role's record holds the whole joint episode (every role's moves, each step with its
`role`) and that role's own training sequence; its trajectory id is the draw's with `-<role>`, its
GRPO group the draw's group with `/<role>` (`multi_agent.role_group`), its reward that role's score
from `role_rewards`, sent through the reward service as the harness's score (reward source
`harness`: a multi-agent harness is scored by its roles' rewards only). Roles seated `scripted`
or at a fixed opponent's server are played, never recorded as trained sequences. A refusal of the
episode's reset at capacity (`EnvironmentBusy`) is waited out as for a single-agent episode
(`env_busy.py`): counted as backpressure, the episode played again; past `rollout.env_busy_timeout_s`
every policy role's record is masked (`environment_busy`), never a harness error.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentrl_cli.core.episode import Trajectory
from agentrl_cli.core.errors import EnvironmentBusy
from agentrl_cli.runtime.rollout.env_busy import EnvBusy, given_up
from agentrl_cli.runtime.rollout.episode_loop import EpisodeResult
from agentrl_cli.runtime.rollout.episode_scaffold import Lent, account, count, infra_lost, keep, lend, score, settings
from agentrl_cli.runtime.rollout.multi_episode import MultiEpisodeResult, Seat, play_seats
from harnesses.multi_agent import POLICY, SCRIPTED, is_multi_agent, policy_roles, require_harness_reward, role_group, seats


@dataclass
class RolePlayed:
    role: str
    result: EpisodeResult  # the role's view: the joint trajectory, its own tokens
    scored: object  # RewardResult
    record: object  # TrajectoryRecord


class Seating:
    """Per harness name: whether it is multi-agent, and its roles' seats (validated once; ConfigError)."""

    def __init__(self, controller) -> None:
        self.ctrl = controller
        self._multi: dict[str, bool] = {}
        self._seats: dict[str, dict[str, str]] = {}
        self.opponents: dict[str, object] = {}  # url -> InferenceClient

    def is_multi(self, name: str) -> bool:
        if name not in self._multi:
            from harnesses.registry import resolve

            self._multi[name] = is_multi_agent(resolve(name))
        return self._multi[name]

    def seats(self, name: str) -> dict[str, str]:
        if name not in self._seats:
            from harnesses.registry import resolve

            hc = next((h for h in self.ctrl.config.harnesses if h.name == name), None)
            seated = seats(resolve(name), getattr(hc, "roles", None), name)
            if seated:
                require_harness_reward(name, self.ctrl.reward_source(name))
            self._seats[name] = seated
        return self._seats[name]

    def policy_roles(self, name: str) -> list[str]:
        return policy_roles(self.seats(name))

    def groups(self, group_id: str, name: str) -> list[str]:
        """The buffer's groups a draw of `name` fills: one per policy role (one, the draw's, for a single-agent harness)."""
        return [role_group(group_id, r) for r in self.policy_roles(name)] if self.is_multi(name) else [group_id]

    def client(self, seat: str):
        if seat == POLICY:
            return self.ctrl.client
        if seat not in self.opponents:
            from agentrl_cli.engines.inference.client import InferenceClient

            # an opponent's server speaks the protocol of the run's engine (the deployment's)
            self.opponents[seat] = InferenceClient(seat, timeout_s=self.ctrl.config.rollout.opponent_timeout_s,
                                                   engine=getattr(self.ctrl.client, "engine", None))
        return self.opponents[seat]

    def make_seats(self, name: str) -> dict[str, Seat]:
        return {role: Seat(role, seat, None if seat == SCRIPTED else self.client(seat)) for role, seat in self.seats(name).items()}

    async def aclose(self) -> None:
        for client in self.opponents.values():
            await client.close()
        self.opponents.clear()


def role_trajectory_id(base: str, role: str) -> str:
    return f"{base}-{role}"


async def play_roles(ctrl, draw, lost=infra_lost, *, temperature: float | None = None, store: bool = True,
                     counted: bool = False) -> list[RolePlayed]:
    """Play, score and (with `store`) record one episode of a multi-agent harness; one RolePlayed per
    policy role, in the harness's role order. `lost(tid, why, flag)`: the masked result of an episode
    the infrastructure could not finish (`episode_scaffold.infra_lost`); `counted`: as `RolloutController.play`."""
    name = draw.task.harness
    busy = EnvBusy(ctrl, name)
    while True:
        seated = ctrl.seating.make_seats(name)
        try:
            async with lend(ctrl, name, counted) as lent:
                played = await play_seats(lent.harness, draw.task, seated, ctrl.tokenizer, ctrl.executor,
                                          settings(ctrl, draw, temperature))
                lent.played(played)
                ctrl.harness_errors.record(name, played, ctrl.counters)  # the run's error budget, as for any harness
            break
        except EnvironmentBusy as refused:  # backpressure, as for a single-agent episode: never a harness error
            if not await busy.wait(refused):
                played = given_up(MultiEpisodeResult(trajectory=Trajectory(task=draw.task), step_roles=[], seats=seated),
                                  refused)
                lent = Lent(None)
                break
    count(ctrl, played)
    base = ctrl.trajectory_id(draw)
    out = []
    for role in policy_roles(ctrl.seating.seats(name)):
        result = played.role_result(role)
        tid = role_trajectory_id(base, role)
        scored = await score(ctrl, played, tid, "harness", played.role_rewards.get(role), lost)
        ctrl.counters["tokens_generated"] += result.completion_tokens
        record = ctrl.to_record(draw, result, scored, tid, role=role, step_roles=played.step_roles)
        out.append(RolePlayed(role, result, scored, record))
    account(ctrl, name, lent, [p.record for p in out])
    for p in out:
        keep(ctrl, p.record, store)
    return out


