"""`agentrl stage run 8 --phase full` on a random tiny model, as a user runs it: refused before a
passing short run and stage 0 baseline (naming them), run after them, its metrics read by verify's
convergence layer; and, under `-m long`, run anyway with --force, which its report records. One harness with two eval tasks keeps the evaluations short. (The order's rules,
unit by unit: tests/unit/test_phase_order.py.)"""

from __future__ import annotations

import json
import shutil

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.integration,
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")]


@pytest.fixture
def small(write_yaml, tmp_path, quick_sets) -> list[str]:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"task_id": f"{split}{i}", "prompt": f"Compute {i} + 1.", "answer": str(i + 1),
                                         "split": split}) + "\n" for split, n in (("train", 4), ("eval", 2)) for i in range(n)))
    write_yaml(f"harnesses:\n  - name: terminal_like\n    tasks: '{tasks}'\n")
    # the random model gains nothing: the short phase is judged on its other checks
    return [*quick_sets, "--set", "stages.short_recipe=null", "--set", "stages.short_min_success_gain=0"]


def _checks(data) -> dict:
    return {c["name"]: c for c in data["reports"][-1]["checks"]}


def test_full_is_refused_out_of_order_and_runs_after_a_baseline_and_short_where_verify_reads_it(cli, small, isolated):
    from agentrl_cli.acceptance.verify.core import verify
    from agentrl_cli.config import load_config
    from agentrl_cli.core.rundir import RunDir

    refused = cli("stage", "run", "8", "--phase", "full", *small)
    assert refused.exit_code == 2 and "stage 8 short" in refused.stderr and "stage 0 baseline" in refused.stderr
    assert "agentrl stage run 8 --phase short" in refused.stderr and not (isolated / "runs").exists()

    result, first = cli.json("stage", "run", "0,8", "--phase", "short", *small, "--set", "training.total_steps=5")
    assert result.exit_code == 0, [(r["stage"], n, c["detail"][-300:]) for r in first["reports"]
                                   for n, c in _checks({"reports": [r]}).items() if c["status"] == "fail"]

    other = cli("stage", "run", "8", "--phase", "full", *small, "--set", "training.learning_rate=0.5")
    assert other.exit_code == 2 and "stage 8 short" in other.stderr  # another configuration: its own order

    result, full = cli.json("stage", "run", "8", "--phase", "full", *small, "--set", "training.total_steps=3")
    checks = _checks(full)
    assert result.exit_code == 0, {n: c["detail"][-300:] for n, c in checks.items() if c["status"] == "fail"}
    assert checks["full run"]["status"] == "pass" and checks["full run"]["measured"]["steps"] == 3
    # judged as a long run (tests/unit/test_stage8_full_stability.py): 3 steps make 2 evaluations, too few for thirds
    assert checks["eval success holds"]["status"] == "skip" and "2 evaluations" in checks["eval success holds"]["detail"]
    assert checks["gradient norm stable"]["status"] == checks["entropy neither collapses nor explodes"]["status"] == "pass"
    order = checks["earlier phases"]
    assert order["status"] == "pass" and order["measured"]["stage 8 short"] == order["measured"]["stage 0 baseline"] == first["run_id"]
    assert "forced_order" not in full["reports"][-1]["environment"]

    loaded = load_config(None, [a for a in small if "=" in a], env={})
    report = verify(loaded, RunDir(isolated / "runs" / full["run_id"]), layers=["convergence"], measure=False)
    assert report.judged.startswith("3 trainer steps from stage8 metrics")
    assert [c.status for c in report.layers["convergence"]] != ["skip"]  # judged, not "too few trainer steps"


@pytest.mark.long
def test_full_runs_with_force_without_a_short_and_its_report_says_so(cli, small):
    result, full = cli.json("stage", "run", "8", "--phase", "full", "--force", *small, "--set", "training.total_steps=2")
    checks = _checks(full)
    assert result.exit_code == 0, {n: c["detail"][-300:] for n, c in checks.items() if c["status"] == "fail"}
    order = checks["earlier phases"]
    assert order["status"] == "info" and order["measured"]["forced"] is True
    assert "stage 8 short" in order["detail"] and "stage 0 baseline" in order["detail"]
    assert full["reports"][-1]["environment"]["forced_order"] is True
