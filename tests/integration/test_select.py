"""`agentrl select` end to end on the random tiny model, one rank: a reduced probe set (the short
loop's criteria, ZeRO-3 of the stress table on one rank, installed metadata) writes a complete scorecard, its
reports and its section of the run's HTML report; and the checkpoint probe resumes DeepSpeed's own
checkpoint and loads the kept fixture of an earlier agentrl version. The full set on both backends
is tests/integration/test_select_builtin.py (the `builtin` marker)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.integration.conftest import needs_bwrap

pytestmark = pytest.mark.integration
CRITERIA = "throughput,parallel,weight_sync,dependencies,maintenance"


@needs_bwrap
def test_select_writes_a_complete_scorecard_with_the_stress_table(cli, random_model_dir, isolated):
    result, data = cli.json("select", "--backends", "deepspeed", "--model", str(random_model_dir), "--criteria", CRITERIA,
                            "--stress-ranks", "1", "--strategies", "zero3", "--micro-batches", "1,2",
                            "--steps", "2",
                            "--set", f"inference.port={free_port()}", "--set", 'harnesses=[{"name": "terminal_like"}]',
                            "--set", f"observe.runs_dir={isolated / 'runs'}")
    assert result.exit_code == 0, (data["unmeasured"], result.output[-2000:])
    assert data["complete"] and data["unmeasured"] == [] and data["backends"] == ["deepspeed"]
    assert [c["key"] for c in data["criteria"]] == CRITERIA.split(",")
    cells = {c["key"]: c["results"]["deepspeed"] for c in data["criteria"]}
    assert all(c["status"] in ("pass", "fail", "info") and c["measured"] is not None and c["detail"] and c["expected"]
               for c in cells.values()), cells
    assert set(cells["throughput"]["measured"]["seconds"]) >= {"sampling", "training", "sync"}
    assert cells["weight_sync"]["measured"]["verified_syncs"] == 2
    rows = data["tables"]["parallel"]
    assert [(r["strategy"], r["ranks"]) for r in rows] == [("zero3", 1)]
    for r in rows:
        assert r["status"] == "ok" and [p["mbs"] for p in r["points"]] == [1, 2], r
        assert all(p["peak_mib"] > 0 and p["step_s"] > 0 for p in r["points"]), r  # the model and optimizer are counted
        assert r["fit"] is not None and r["fit"]["points"] == 2
    reports = Path(data["reports"]["json"]).parent
    assert json.loads((reports / "select.json").read_text())["criteria"] == data["criteria"]
    md = (reports / "select.md").read_text()
    assert "| criterion | deepspeed | deployment action |" in md and "| zero3 | 1 | ok |" in md
    assert "Framework selection scorecard" in Path(data["reports"]["html"]).read_text()


def test_checkpoint_probe_resumes_its_own_and_loads_the_kept_fixture(random_model_dir, tmp_path):
    from agentrl_cli.acceptance.select.checkpoint_probe import RESUME_RTOL, probe_all

    result = probe_all(["deepspeed"], random_model_dir, tmp_path)["deepspeed"]
    own = result["own_resume"]
    assert own["ok"] and own["restored_step"] == 1 and own["relative_difference"] <= RESUME_RTOL, own
    assert [k["fixture"] for k in result["kept_fixtures"]][:1] == ["checkpoint-v1"]
    assert all(k["loaded"] for k in result["kept_fixtures"]), result
