"""One episode of a multi-agent harness (`harnesses.multi_agent`), asynchronously: reset, then
while the harness names a role `to_move`, show that role its own observation (`observe(role)`),
get its move from its seat (the policy's inference server, a fixed opponent's server, or the
harness's `scripted_move`), and `step` it; until done, the step limit (`truncated`) or a deadline.

Each model-played role has its own conversation under the model's chat template (its system
prompt `role_prompt(role)` and the harness's `tools()`), kept as token ids as `run_episode` keeps
one: its prompt, each of its generations exactly as served (loss mask 1, log-probs), and before each
later move what it is shown then (loss mask 0). Its move reaches the harness as the single-agent
loop builds it: the text and the tool calls its chat renderer parsed (`turns.Seat.action`). The
joint trajectory (every role's moves in order, `step_roles`) is what the harness saw, what is stored
with every role's record and what replay plays again. After the episode `role_rewards` scores each
role while the state is alive.

A generation that cannot be completed ends the episode `infra_error` (masked for every role); an
exception from harness code ends it `infra_error` too, naming the method. This is the one episode
loop (`episode_loop.play_episode`) with one seat per role (`turns.py`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from agentrl_cli.core.episode import HarnessReward, Trajectory
from agentrl_cli.core.outcomes import Termination
from agentrl_cli.engines.resume import ResumePolicy
from agentrl_cli.runtime.rollout.episode_loop import EpisodeResult, Settings, harness_failed, play_episode
from agentrl_cli.runtime.rollout.turns import Seat, Turns
from harnesses.multi_agent import role_prompt

__all__ = ["MultiEpisodeResult", "RoleTurns", "Seat", "play_seats", "run_multi_episode"]


@dataclass
class MultiEpisodeResult:
    trajectory: Trajectory  # the joint episode: every role's moves in order
    step_roles: list[str]
    seats: dict[str, Seat]
    termination: str = Termination.TRUNCATED
    role_rewards: dict[str, HarnessReward] = field(default_factory=dict)
    evidence: object | None = None
    step_times: list[tuple] = field(default_factory=list)
    generate_s: float = 0.0
    env_s: float = 0.0
    error: str = ""
    counters: Counter = field(default_factory=Counter)
    harness_error: tuple[str, str] | None = None
    infra_flag: str = ""  # infra_error: the flag that says why, when not the controller's own guess

    def role_result(self, role: str) -> EpisodeResult:
        """The single-agent view of `role`: the joint trajectory with its own training sequence, as
        the record and the scoring request are built from."""
        s = self.seats[role]
        return EpisodeResult(trajectory=self.trajectory, evidence=self.evidence, termination=self.termination,
                             token_ids=s.token_ids, loss_mask=s.loss_mask, logprobs=s.logprobs,
                             weight_versions=s.weight_versions, pieces=s.pieces, step_times=self.step_times,
                             prompt_tokens=s.prompt_tokens, completion_tokens=s.completion_tokens,
                             generate_s=self.generate_s, env_s=self.env_s, error=self.error, counters=Counter(),
                             harness_error=self.harness_error, harness_reward=self.role_rewards.get(role),
                             infra_flag=self.infra_flag)


class RoleTurns(Turns):
    """The roles' turns: the harness names who moves (`to_move`), each model role is shown its own
    view (`observe(role)`) before it moves, under its own system prompt (`role_prompt`); every
    role is scored by `role_rewards` after the evidence."""

    def __init__(self, seats: dict[str, Seat], tokenizer) -> None:
        super().__init__(seats, tokenizer)
        self.tools: list[dict] | None = None  # the harness's tools(), read when a model role first moves

    async def to_move(self, ep):
        return await ep.attempt("to_move")

    async def view(self, ep, seat: Seat) -> bool:
        ok, view = await ep.attempt("observe", seat.role)
        if not ok:
            return False
        if seat.chat is not None:
            seat.show(view.text)
            return True
        ok, system = ep.guard("role_prompt", role_prompt, ep.harness, seat.role)
        if ok and self.tools is None:
            ok, self.tools = ep.prompt_part("tools", [])
        if ok:
            seat.open(self.tokenizer, system, self.tools, view.text)
        return ok

    def label(self, role: str) -> str:
        return f"role {role}: "

    async def score(self, ep) -> None:
        result = ep.result
        scores = await ep.harness_reward("role_rewards", lambda out: {str(r): HarnessReward.of(v) for r, v in dict(out).items()})
        if scores is None:
            return
        result.role_rewards = scores
        missing = [r for r in self.seats if r not in scores]
        if missing:
            harness_failed(result, "role_rewards", ValueError(f"no score for role {', '.join(missing)}"))


async def run_multi_episode(harness, task, seats: dict[str, Seat], tokenizer, executor, *, max_steps: int,
                            step_timeout_s: float, max_new_tokens: int, temperature: float = 1.0, seed: int | None = None,
                            context_limit: int = 2048, resume: ResumePolicy | None = None, on_recovered=None,
                            watchdog=None, stats=None, create_retries: int = 0,
                            create_backoff_s: float = 0.5) -> MultiEpisodeResult:
    """Play one episode with `seats` (role -> Seat; a model seat carries its client). `seed`: each
    generation's seed is derived from it and the joint step. `stats` (observe.harness_stats.HarnessStats)
    records the environment's creation and step latencies and each generation's. A creation (`reset`)
    that raises is retried `create_retries` times with doubling backoff. See the module docstring."""
    settings = Settings(max_steps=max_steps, step_timeout_s=step_timeout_s, max_new_tokens=max_new_tokens,
                        temperature=temperature, seed=seed, context_limit=context_limit, create_retries=create_retries,
                        create_backoff_s=create_backoff_s, reward_source="harness", resume=resume or ResumePolicy(),
                        on_recovered=on_recovered, watchdog=watchdog, stats=stats)
    return await play_seats(harness, task, seats, tokenizer, executor, settings)


async def play_seats(harness, task, seats: dict[str, Seat], tokenizer, executor, settings: Settings) -> MultiEpisodeResult:
    """`run_multi_episode` with its settings in one object (what the controller passes)."""
    turns = RoleTurns(seats, tokenizer)
    result = MultiEpisodeResult(trajectory=Trajectory(task=task), step_roles=turns.step_roles, seats=seats)
    return await play_episode(harness, task, turns, executor, settings, result)
