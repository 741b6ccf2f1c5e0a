"""Stage 8 smoke's resumed run takes the first run's inference server (`agentrl_cli/run/kept_servers.py`):
the model is loaded once for both runs, the resume passes, and no server outlives the stage."""

from __future__ import annotations

import shutil
import socket

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.integration,
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")]


def test_stage_8_smoke_resumes_on_the_first_runs_server_and_stops_it_at_the_end(cli, quick_sets, isolated):
    result, data = cli.json("stage", "run", "8", *quick_sets)
    checks = {c["name"]: c for c in data["reports"][0]["checks"]}
    assert checks["reloaded and resumed"]["status"] == "pass", checks["reloaded and resumed"]
    assert checks["loss finite"]["status"] == "pass", checks["loss finite"]
    [run] = [p for p in (isolated / "runs").iterdir() if (p / "meta.json").exists()]
    [log] = (run / "stage8" / "logs").glob("*-0.log")
    assert log.read_text().count("embedded inference server on") == 1  # one start served both runs
    port = int(next(s for s in quick_sets if s.startswith("inference.port=")).split("=")[1])
    with socket.socket() as s:  # and it was stopped when the stage ended
        assert s.connect_ex(("127.0.0.1", port)) != 0
