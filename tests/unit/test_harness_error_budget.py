"""The budget on a harness's own failures: N in a row stop the run, and so does a failure share above
`max_harness_error_rate` over a full window, while rare failures never do; episodes lost to
inference are not the harness's and count neither way."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

from agentrl_cli.runtime.rollout.harness_errors import HarnessErrors


def episode(failed: bool, termination: str = "done"):
    return SimpleNamespace(harness_error=("step", "RuntimeError: boom at env.py:3 in step") if failed else None,
                           termination="infra_error" if failed else termination)


def test_failures_in_a_row_stop_the_run_naming_harness_method_and_exception():
    errors, counters = HarnessErrors(limit=3, rate=1.0, window=0), Counter()
    for failed in (True, True, False, True, True):
        errors.record("env", episode(failed), counters)
    assert errors.failed is None and counters["env/env/harness_errors/step"] == 4
    errors.record("env", episode(True), counters)
    assert "harness 'env': step() raised in 3 episodes in a row: RuntimeError: boom" in errors.failed.message
    assert "agentrl harness check env" in errors.failed.hint


def test_a_failure_share_above_the_rate_over_a_full_window_stops_the_run():
    errors, counters = HarnessErrors(limit=0, rate=0.5, window=10), Counter()
    for i in range(11):
        errors.record("env", episode(i % 3 != 0), counters)  # never 3 in a row; the last 10: 7 fail
    assert errors.failed is not None and "in 7 of its last 10 episodes (70% > 50%)" in errors.failed.message


def test_one_failure_in_ten_never_stops_the_run_and_inference_losses_are_not_counted():
    errors, counters = HarnessErrors(limit=8, rate=0.5, window=10), Counter()
    for i in range(100):
        errors.record("env", episode(i % 10 == 0), counters)
        errors.record("env", episode(False, termination="infra_error"), counters)  # lost to inference
    assert errors.failed is None and counters["env/env/harness_errors/step"] == 10
