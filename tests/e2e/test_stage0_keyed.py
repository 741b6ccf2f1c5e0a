"""`agentrl stage run 0` against embedded servers that require a bearer token (`inference.api_key`):
the run sends the key with every request (generation, weight sync, re-sync checks) and passes."""

from __future__ import annotations

import shutil

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.integration,
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")]


def test_stage_0_passes_with_an_api_key(cli, quick_sets):
    result, data = cli.json("stage", "run", "0", *quick_sets, "--set", "inference.api_key=stage0-s3cret")
    report = data["reports"][0]
    failing = [(c["name"], c["detail"][-400:]) for c in report["checks"] if c["status"] == "fail"]
    assert result.exit_code == 0 and report["status"] == "pass", failing
    assert "stage0-s3cret" not in result.stdout  # the key is never written to reports
