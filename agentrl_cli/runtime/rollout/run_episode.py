"""One episode played by the policy alone, asynchronously: reset the harness, render the
conversation with the model's chat template, ask the inference server for tokens (with log-probs
and the weight version), pass the action (its text and the tool calls the chat renderer parsed from
it) to the harness, repeat until done, the step limit (`truncated`) or a deadline (`timeout`).

The training sequence is kept as token ids, never re-tokenized: the prompt, then each generated
segment exactly as the server returned it (loss mask 1, its log-probs), then the environment's
reply rendered by the chat template (loss mask 0), shown as soon as the step returns. Harness calls
are synchronous and run in the given executor, so many episodes overlap their environment waits
with generation.

A generation the server aborts or loses is resumed from its partial tokens (`resume.py`); one that
cannot be completed ends the episode as `infra_error` — masked from training, not the agent's fault.

This is the one episode loop (`episode_loop.play_episode`) with one policy seat (`turns.py`); the
names below stay importable from here (`EpisodeResult`, `harness_failed`, `env_caller`).
"""

from __future__ import annotations

from agentrl_cli.core.episode import HarnessReward, Trajectory
from agentrl_cli.core.outcomes import Termination
from agentrl_cli.engines.inference.client import InferenceClient
from agentrl_cli.engines.resume import ResumePolicy
from agentrl_cli.runtime.rollout.episode_loop import EpisodeResult, Settings, env_caller, harness_failed, play_episode
from agentrl_cli.runtime.rollout.turns import Seat, Turns
from harnesses.multi_agent import POLICY

__all__ = ["EpisodeResult", "PolicyTurns", "env_caller", "harness_failed", "play_policy", "run_episode"]


class PolicyTurns(Turns):
    """The policy's turns in a single-agent episode: its system prompt and tools, the first
    observation as its first prompt, each step's observation shown at once; `compute_reward` after
    the evidence when `harnesses[].reward` asks for it."""

    def __init__(self, client, tokenizer) -> None:
        super().__init__({POLICY: Seat(POLICY, POLICY, client)}, tokenizer)
        self.seat = self.seats[POLICY]

    async def act(self, ep, first) -> bool:
        ok, system = ep.prompt_part("system_prompt", "")
        if ok:
            ok, tools = ep.prompt_part("tools", [])
        if not ok:
            return False  # the harness failed: nothing to score
        self.seat.open(self.tokenizer, system, tools, first.text)
        return await super().act(ep, first)

    async def to_move(self, ep):
        return True, POLICY

    def shown(self, seat, obs) -> None:
        seat.show(obs.text)

    async def score(self, ep) -> None:
        if ep.settings.reward_source != "verifiers":
            ep.result.harness_reward = await ep.harness_reward("compute_reward", HarnessReward.of)


async def run_episode(harness, task, client: InferenceClient, tokenizer, executor, *, max_steps: int,
                      step_timeout_s: float, max_new_tokens: int, temperature: float = 1.0, seed: int | None = None,
                      context_limit: int = 2048, resume: ResumePolicy | None = None, on_recovered=None,
                      watchdog=None, stats=None, create_retries: int = 0, create_backoff_s: float = 0.5,
                      reward_source: str = "verifiers") -> EpisodeResult:
    """`on_recovered`: awaited after a lost server answers again, before generating resumes (the
    run re-syncs weights there). `watchdog`: beats "rollout" per generation and per env step and
    tracks the harness as "harness NAME". `stats` (observe.harness_stats.HarnessStats) records the
    environment's creation and step latencies and its creation failures by error. A creation
    (`reset`) that raises is retried `create_retries` times with doubling backoff; when it still
    fails the episode ends `infra_error` (masked: the environment failed, not the agent).
    `reward_source` `harness` or `mix` (harnesses[].reward): the harness's `compute_reward` runs after
    the evidence, while the episode's state is alive, and its result goes with the scoring request."""
    settings = Settings(max_steps=max_steps, step_timeout_s=step_timeout_s, max_new_tokens=max_new_tokens,
                        temperature=temperature, seed=seed, context_limit=context_limit, create_retries=create_retries,
                        create_backoff_s=create_backoff_s, reward_source=reward_source, resume=resume or ResumePolicy(),
                        on_recovered=on_recovered, watchdog=watchdog, stats=stats)
    return await play_policy(harness, task, client, tokenizer, executor, settings)


async def play_policy(harness, task, client: InferenceClient, tokenizer, executor, settings: Settings) -> EpisodeResult:
    """`run_episode` with its settings in one object (what the controller passes)."""
    result = EpisodeResult(trajectory=Trajectory(task=task), evidence=None, termination=Termination.TRUNCATED)
    turns = PolicyTurns(client, tokenizer)
    try:
        return await play_episode(harness, task, turns, executor, settings, result)
    finally:
        seat = turns.seat
        if seat.chat is not None:  # the policy's sequence, as far as it got
            result.token_ids, result.loss_mask, result.logprobs = seat.token_ids, seat.loss_mask, seat.logprobs
            result.weight_versions, result.pieces = seat.weight_versions, seat.pieces
            result.prompt_tokens, result.completion_tokens = seat.prompt_tokens, seat.completion_tokens
