"""Backpressure from an environment's server at capacity: a refusal of a new session (OpenEnv's
`CAPACITY_REACHED`, HTTP 429, or 503 with Retry-After, raised by the harness as `EnvironmentBusy`)
is waited out, never counted as a harness error. Each refusal is counted (`env/<harness>/backpressure`);
a refusal that names the server's limit caps the harness's pool at it (`env/<harness>/capacity`),
so the run plays no more episodes of that harness at once than the server holds sessions. The wait
before the next try is `rollout.env_create_backoff_s` doubled per refusal, at most `MAX_WAIT_S` (or the
server's Retry-After); an episode refused for longer than `rollout.env_busy_timeout_s` ends
`infra_error` flagged `environment_busy` (masked).

Belongs here: one episode's waits and what they teach the controller. Not here: the pool itself
(`controller.HarnessPool`), telling a refusal from other errors (the harness's client).
"""

from __future__ import annotations

import asyncio
import logging
import time

from agentrl_cli.core.errors import EnvironmentBusy
from agentrl_cli.runtime.observe import keys

log = logging.getLogger(__name__)
MAX_WAIT_S = 10.0  # the longest single wait between tries, whatever the doubling reaches
FIRST_WAIT_S = 0.05  # the first wait when rollout.env_create_backoff_s is 0


class EnvBusy:
    """The refusals one episode of harness `name` met, and the waits after them."""

    def __init__(self, ctrl, name: str) -> None:
        self.ctrl, self.name = ctrl, name
        self.refusals = 0
        self.started = time.monotonic()

    async def wait(self, refused: EnvironmentBusy) -> bool:
        """Count `refused`, cap the pool at the capacity it names and wait; False once the episode has
        waited longer than `rollout.env_busy_timeout_s` (it is then given up, masked)."""
        ctrl, r = self.ctrl, self.ctrl.config.rollout
        self.refusals += 1
        ctrl.counters[keys.env_backpressure(self.name)] += 1
        if refused.capacity is not None:
            pool = ctrl.harness_pool(self.name)
            if refused.capacity < pool.limit:
                log.warning("harness %s: its environment's server holds %d session(s); playing at most %d episode(s) "
                            "of it at once (was %d)", self.name, refused.capacity, refused.capacity, pool.limit)
            pool.cap(refused.capacity)
            ctrl.counters[keys.env_capacity(self.name)] = pool.limit
        if time.monotonic() - self.started > r.env_busy_timeout_s:
            return False
        doubled = (r.env_create_backoff_s or FIRST_WAIT_S) * 2 ** min(self.refusals - 1, 16)
        wait = refused.retry_after_s if refused.retry_after_s is not None else doubled
        await asyncio.sleep(min(max(wait, 0.0), MAX_WAIT_S))
        return True


def busy_too_long(draw, refused: EnvironmentBusy):
    """The result of an episode whose environment refused it past `rollout.env_busy_timeout_s`:
    `infra_error` flagged `environment_busy` (masked), no harness error."""
    from agentrl_cli.core.outcomes import Termination
    from agentrl_cli.runtime.rollout.episode_loop import EpisodeResult
    from harnesses.base import Trajectory

    return given_up(EpisodeResult(trajectory=Trajectory(task=draw.task), evidence=None, termination=Termination.TRUNCATED),
                    refused)


def given_up(result, refused: EnvironmentBusy):
    """`result` (a single- or multi-agent episode's, not played) ended as refused past
    `rollout.env_busy_timeout_s`: `infra_error` flagged `environment_busy`."""
    from agentrl_cli.core.outcomes import Termination

    result.termination, result.infra_flag = Termination.INFRA_ERROR, "environment_busy"
    result.error = f"environment busy past rollout.env_busy_timeout_s: {refused.message}"
    return result
