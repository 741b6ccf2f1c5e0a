"""A harness's own bugs, counted and bounded. An exception in harness code (reset, step, evidence,
system_prompt, tools) ends that episode `infra_error` (masked, so its group still completes; see
`run_episode.harness_failed`) and is counted per harness and method as
`env/<harness>/harness_errors/<method>`. When one harness fails `rollout.max_harness_errors`
episodes in a row, the run stops (`HarnessFailed`, exit 1) naming the harness, the method and the
exception, instead of training on nothing or waiting for groups that never fill.
"""

from __future__ import annotations

import logging
from collections import Counter

from agentrl_cli.errors import AgentrlError
from agentrl_cli.observe import keys
from agentrl_cli.outcomes import Termination

log = logging.getLogger(__name__)


class HarnessFailed(AgentrlError):
    exit_code = 1


class HarnessErrors:
    def __init__(self, limit: int) -> None:
        self.limit = limit  # consecutive failed episodes of one harness that stop the run; 0 = never
        self.consecutive: Counter = Counter()
        self.failed: HarnessFailed | None = None
        self._logged: set[tuple[str, str]] = set()

    def record(self, harness: str, result, counters: Counter) -> None:
        """Count `result`'s harness error, if any; an episode the harness played through resets the run of failures."""
        if result.harness_error is None:
            if result.termination != Termination.INFRA_ERROR:  # lost to inference: says nothing of the harness
                self.consecutive[harness] = 0
            return
        method, what = result.harness_error
        counters[keys.env_harness_errors(harness, method)] += 1
        self.consecutive[harness] += 1
        if (harness, method) not in self._logged:
            self._logged.add((harness, method))
            log.error("harness %s: %s() raised %s (episode masked as infra_error)", harness, method, what)
        if self.limit and self.consecutive[harness] >= self.limit and self.failed is None:
            self.failed = HarnessFailed(
                f"harness {harness!r}: {method}() raised in {self.consecutive[harness]} episodes in a row: {what}",
                f"fix the harness's {method}() (check it with `pytest tests/integration/test_harness_contract.py "
                f"--harness {harness}`), or raise rollout.max_harness_errors (0 = never stop)")

    def raise_if_failed(self) -> None:
        if self.failed is not None:
            raise self.failed
