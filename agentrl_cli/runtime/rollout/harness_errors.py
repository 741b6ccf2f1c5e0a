"""A harness's own bugs, counted and bounded. An exception in harness code (reset, step, evidence,
system_prompt, tools) ends that episode `infra_error` (masked, so its group still completes; see
`run_episode.harness_failed`) and is counted per harness and method as
`env/<harness>/harness_errors/<method>`. The run stops (`HarnessFailed`, exit 1) naming the harness,
the method and the exception, instead of training on nothing or waiting for groups that never fill,
when one harness fails `rollout.max_harness_errors` episodes in a row, or more than
`rollout.max_harness_error_rate` of its last `rollout.harness_error_window` episodes (judged once
the window is full). Episodes lost to inference or with their sandbox (`EnvironmentLost`) say nothing
of the harness and are not counted.
"""

from __future__ import annotations

import logging
from collections import Counter, deque

from agentrl_cli.core.errors import AgentrlError
from agentrl_cli.runtime.observe import keys
from agentrl_cli.core.outcomes import Termination

log = logging.getLogger(__name__)


class HarnessFailed(AgentrlError):
    exit_code = 1


class HarnessErrors:
    def __init__(self, limit: int, rate: float = 1.0, window: int = 0) -> None:
        self.limit = limit  # consecutive failed episodes of one harness that stop the run; 0 = never
        self.rate, self.window = rate, window  # share of the last `window` episodes; window 0 = no rate limit
        self.consecutive: Counter = Counter()
        self.recent: dict[str, deque] = {}
        self.failed: HarnessFailed | None = None
        self._logged: set[tuple[str, str]] = set()

    def record(self, harness: str, result, counters: Counter) -> None:
        """Count `result`'s harness error, if any; an episode the harness played through resets the run of failures."""
        if result.harness_error is None and result.termination == Termination.INFRA_ERROR:
            return  # lost to inference or with its sandbox: says nothing of the harness
        recent = self.recent.setdefault(harness, deque(maxlen=max(self.window, 1)))
        recent.append(result.harness_error is not None)
        if result.harness_error is None:
            self.consecutive[harness] = 0
            return
        method, what = result.harness_error
        counters[keys.env_harness_errors(harness, method)] += 1
        self.consecutive[harness] += 1
        if (harness, method) not in self._logged:
            self._logged.add((harness, method))
            log.error("harness %s: %s() raised %s (episode masked as infra_error)", harness, method, what)
        if self.failed is not None:
            return
        share = sum(recent) / len(recent)
        if self.limit and self.consecutive[harness] >= self.limit:
            why = f"in {self.consecutive[harness]} episodes in a row"
        elif self.window and len(recent) == self.window and share > self.rate:
            why = f"in {sum(recent)} of its last {self.window} episodes ({share:.0%} > {self.rate:.0%})"
        else:
            return
        self.failed = HarnessFailed(
            f"harness {harness!r}: {method}() raised {why}: {what}",
            f"fix the harness's {method}() (check it with `agentrl harness check {harness}`), or raise "
            "rollout.max_harness_errors / rollout.max_harness_error_rate (0 errors = never stop)")

    def raise_if_failed(self) -> None:
        if self.failed is not None:
            raise self.failed
