"""`agentrl stage run 5` on this machine: every check passes and shows what it measured."""

from __future__ import annotations

import shutil

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.integration,
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")]


def test_stage_5_passes_with_measured_values(cli, quick_sets):
    result, data = cli.json("stage", "run", "5", *quick_sets)
    report = data["reports"][0]
    failing = [(c["name"], c["detail"][:200]) for c in report["checks"] if c["status"] != "pass"]
    assert result.exit_code == 0 and report["status"] == "pass", failing
    names = {c["name"] for c in report["checks"]}
    assert {"isolation (bubblewrap namespaces)", "seccomp filter", "create/exec/reclaim under concurrency",
            "timeout ends the command", "memory limit", "process limit", "CPU-time limit", "file-size limit",
            "output limit", "egress denied"} <= names
    for harness in ("terminal_like", "code_sandbox_like", "tool_api_like"):
        assert f"harness {harness}: clean reset" in names and f"harness {harness}: scripted episodes" in names
        played = next(c for c in report["checks"] if c["name"] == f"harness {harness}: one episode through the training path")
        assert played["measured"]["stored"] is True and played["measured"]["reward_status"] in ("ok", "fail", "timeout")
    assert all(c["measured"] is not None for c in report["checks"])
    for harness in ("terminal_like", "code_sandbox_like", "tool_api_like"):  # at the run's concurrency (rollout.concurrency 64)
        played = next(c for c in report["checks"] if c["name"] == f"harness {harness}: concurrency")["measured"]
        assert played["concurrency"] == 64 and played["episodes"] == 64 + 8 and played["failures"] == 0
        assert not any(played["leaks"].values()), played["leaks"]
    churn = next(c for c in report["checks"] if c["name"] == "create/exec/reclaim under concurrency")
    assert churn["measured"]["leaks"] == {"processes": 0, "fds": 0, "dirs": 0}


def test_stage_5_fails_closed_without_bubblewrap(cli):
    result, data = cli.json("stage", "run", "5", "--set", "sandbox.bwrap=/nonexistent/bwrap")
    checks = data["reports"][0]["checks"]
    assert result.exit_code == 1
    assert checks[0]["status"] == "fail" and "apt-get install bubblewrap" in checks[0]["hint"]
    assert checks[1]["status"] == "skip"


def test_stage_5_checks_the_configured_sandbox_limits_and_harness(cli, write_yaml, quick_sets):
    """The harnesses are built as the run builds them: a configured sandbox.memory_mb is the limit the
    harness's sandboxes get and the limit the memory probe holds."""
    write_yaml("harnesses:\n  - name: terminal_like\n")
    result, data = cli.json("stage", "run", "5", *quick_sets, "--set", "sandbox.memory_mb=64", "--set", "stages.sandbox_concurrency=2")
    checks = {c["name"]: c for c in data["reports"][0]["checks"]}
    assert result.exit_code == 0, [(n, c["detail"][:200]) for n, c in checks.items() if c["status"] != "pass"]
    assert checks["harness terminal_like: loads"]["measured"]["sandbox"]["memory_mb"] == 64
    assert checks["memory limit"]["measured"]["limit"] == {"memory_mb": 64}
    assert not any(name.startswith("harness code_sandbox_like") for name in checks)
