"""Errors a user can act on, and the exit codes the command line maps them to.

Every error carries a message (what was wrong) and a hint (what to do). The command line renders
them on stderr without a traceback unless AGENTRL_DEBUG=1. Nothing here imports Typer.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2


class AgentrlError(Exception):
    """Base class: a problem the user can fix. `exit_code` is what the CLI exits with."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:  # pragma: no cover - trivial
        return self.message if not self.hint else f"{self.message}\n  fix: {self.hint}"


class ConfigError(AgentrlError):
    """The configuration file, an override or an environment variable is invalid."""


class UsageError(AgentrlError):
    """The command line was used wrongly (bad stage selector, missing run, ...)."""


class NotFoundError(AgentrlError):
    """A named thing (run, report, harness) does not exist."""


class EnvironmentBusy(AgentrlError):
    """The environment's server refused a new session because it is at capacity (OpenEnv's
    `CAPACITY_REACHED`, HTTP 429, or 503 with Retry-After): backpressure, not a failure. Raised by
    the environment's client from `reset` with no session of its own left open; the rollout
    controller waits (bounded backoff, `rollout.env_busy_timeout_s`), counts it as
    `env/<harness>/backpressure`, caps the harness's instances at `capacity` when the server said
    it, and plays the episode again on an instance that holds a session. Never a harness error."""

    exit_code = 1

    def __init__(self, message: str, capacity: int | None = None, retry_after_s: float | None = None) -> None:
        super().__init__(message, "lower harnesses[].max_concurrency to the server's capacity, or raise the server's "
                                  "session limit (OpenEnv: create_app(..., max_concurrent_envs=N))")
        self.capacity, self.retry_after_s = capacity, retry_after_s


class EnvironmentLost(AgentrlError):
    """The environment an episode runs in is gone (its sandbox's service replica died or restarted):
    the episode ends `infra_error` with `flag` (masked: the infrastructure failed, not the agent),
    never as an error observation the agent is scored on. Raised by the environment's client, caught
    by the episode loop (`runtime/rollout/episode_loop.py`)."""

    exit_code = 1
    flag = "environment_lost"
