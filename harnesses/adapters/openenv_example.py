"""Small OpenEnv environments written with the openenv package's own base classes, for the
`openenv` adapter's defaults, its tests and as examples for an author: each keeps its state per
instance (one per WebSocket session), gives a per-step reward and ends with `done`.

- `BriefReplyEnvironment` (the adapter's default env, action `{"message": str}`): one step; reward 1
  when the reply, stripped, is 1 to `limit` characters long (the limit, 40 to 46, comes from the
  reset seed), else 0. A random model's replies fall on both sides of the limit, so rewards vary
  honestly within a group.
- `GuessNumberEnvironment` (action `{"guess": int}`): find a number in [1, 100] in 7 guesses; each
  observation says higher or lower and narrows `low`/`high`; reward 1 on the right guess.
- `AdditionToolsEnvironment` (an MCP environment: tools `add(a, b)` and `submit(answer)`): compute
  the sum of the two numbers the reset observation names; `submit` ends the episode with reward 1
  when the answer is right.

Belongs here: example environments only. Not here: the adapter (`openenv.py`), serving agentrl
harnesses over OpenEnv (`openenv_server.py`).
"""

from __future__ import annotations

import random
from typing import Any, Optional

from fastmcp import FastMCP
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolObservation
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class ReplyAction(Action):
    message: str = Field(..., description="the reply")


class ReplyObservation(Observation):
    instruction: str = Field(default="", description="what to do")
    feedback: str = Field(default="", description="how the last reply went")
    length: int = Field(default=0, description="characters in the last reply, stripped")


class BriefReplyEnvironment(Environment[ReplyAction, ReplyObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state, self.limit = State(), 43

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> ReplyObservation:
        self._state = State(episode_id=episode_id, step_count=0)
        self.limit = 40 + (seed or 0) % 7
        return ReplyObservation(instruction=f"Reply in at most {self.limit} characters.", reward=0.0)

    def step(self, action: ReplyAction, timeout_s: Optional[float] = None, **kwargs: Any) -> ReplyObservation:
        self._state.step_count += 1
        n = len(action.message.strip())
        ok = 0 < n <= self.limit
        return ReplyObservation(feedback="brief enough" if ok else f"{n} characters; the limit is {self.limit}",
                                length=n, reward=float(ok), done=True)

    @property
    def state(self) -> State:
        return self._state


class GuessAction(Action):
    guess: int = Field(..., description="your guess, an integer from 1 to 100")


class GuessObservation(Observation):
    feedback: str = Field(default="", description="higher, lower or correct")
    low: int = Field(default=1, description="the number is at least this")
    high: int = Field(default=100, description="the number is at most this")
    guesses_left: int = Field(default=7, description="guesses before the episode ends")


class GuessNumberEnvironment(Environment[GuessAction, GuessObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True
    GUESSES = 7

    def __init__(self) -> None:
        super().__init__()
        self._state, self.target, self.low, self.high, self.left = State(), 1, 1, 100, self.GUESSES

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> GuessObservation:
        self._state = State(episode_id=episode_id, step_count=0)
        self.target = random.Random(seed).randint(1, 100)
        self.low, self.high, self.left = 1, 100, self.GUESSES
        return GuessObservation(feedback="guess the number", low=1, high=100, guesses_left=self.left, reward=0.0)

    def step(self, action: GuessAction, timeout_s: Optional[float] = None, **kwargs: Any) -> GuessObservation:
        self._state.step_count += 1
        self.left -= 1
        if action.guess == self.target:
            return GuessObservation(feedback="correct", low=self.target, high=self.target, guesses_left=self.left,
                                    reward=1.0, done=True)
        if action.guess < self.target:
            self.low, feedback = max(self.low, action.guess + 1), "higher"
        else:
            self.high, feedback = min(self.high, action.guess - 1), "lower"
        return GuessObservation(feedback=feedback, low=self.low, high=self.high, guesses_left=self.left,
                                reward=0.0, done=self.left <= 0)

    @property
    def state(self) -> State:
        return self._state


class AdditionToolsEnvironment(MCPEnvironment):
    """An MCP environment: its actions are the package's CallToolAction, its tools FastMCP's."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        mcp = FastMCP("addition")
        env = self

        @mcp.tool()
        def add(a: int, b: int) -> int:
            """Add two integers."""
            return a + b

        @mcp.tool()
        def submit(answer: int) -> str:
            """Submit the final answer; ends the episode."""
            env.submitted = answer
            return "submitted"

        super().__init__(mcp)
        self._state, self.a, self.b, self.submitted = State(), 0, 0, None

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> Observation:
        rng = random.Random(seed)
        self._state, self.a, self.b, self.submitted = State(episode_id=episode_id), rng.randint(10, 99), rng.randint(10, 99), None
        return Observation(reward=0.0, metadata={"task": f"What is {self.a} + {self.b}? Use the tools, then submit."})

    def _step_impl(self, action: Action, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        return Observation(reward=0.0, metadata={"error": f"unknown action {type(action).__name__}; call a tool"})

    def _scored(self, obs: Observation) -> Observation:
        self._state.step_count += 1
        if isinstance(obs, CallToolObservation) and obs.tool_name == "submit" and self.submitted is not None:
            obs.reward, obs.done = float(self.submitted == self.a + self.b), True
        else:
            obs.reward = 0.0
        return obs

    def step(self, action: Action, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        return self._scored(super().step(action, timeout_s=timeout_s, **kwargs))

    async def step_async(self, action: Action, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        return self._scored(await super().step_async(action, timeout_s=timeout_s, **kwargs))

    @property
    def state(self) -> State:
        return self._state

