"""Mistyped commands and options, and missing arguments, through the real console script: a usage
error (exit 2) with the group's usage line and the closest match, never "internal error"."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

AGENTRL = Path(sys.executable).parent / "agentrl"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(AGENTRL), *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args, usage, suggestion", [
    (("frobnicate",), "Usage: agentrl [OPTIONS] COMMAND", None),
    (("stage", "runn", "3"), "Usage: agentrl stage [OPTIONS] COMMAND", "Did you mean 'run'?"),
    (("model", "exprot", "x"), "Usage: agentrl model [OPTIONS] COMMAND", "Did you mean 'export'?"),
    (("stage", "run", "3", "--phse", "smoke"), "Usage: agentrl stage run [OPTIONS]", "--phase"),
    (("troubleshoot", "--rn", "x"), "Usage: agentrl troubleshoot [OPTIONS]", "--run"),
    (("stage", "run"), "Usage: agentrl stage run [OPTIONS]", "Missing argument"),
    (("report", "--opne"), "Usage: agentrl report [OPTIONS]", "--open"),
])
def test_a_usage_mistake_exits_2_with_usage_and_the_closest_match(args, usage, suggestion):
    done = run(*args)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr
    assert usage in done.stderr
    if suggestion:
        assert suggestion in done.stderr


def test_a_real_command_still_runs():
    done = run("stage", "list", "--json")
    assert done.returncode == 0 and '"slug"' in done.stdout
