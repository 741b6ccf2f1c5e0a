"""The installed `agentrl` console script, run in a fresh directory as a new user would."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

AGENTRL = shutil.which("agentrl", path=str(Path(sys.executable).parent)) or shutil.which("agentrl")


def run(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    assert AGENTRL, "the agentrl console script is not installed (pip install -e .)"
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTRL_")} | (env or {})
    return subprocess.run([AGENTRL, *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=300)


def test_stage_run_all_from_a_fresh_directory(tmp_path, quick_sets):
    """Every stage is built: the only check a random model may fail is stage 8 smoke's reward
    degeneracy (all rewards equal), and the exit code says whether any check failed. Stage 4's
    throughput floor is set to 1 token/s here: whether the engine reaches the default floor is judged
    by tests/e2e/test_stage4.py."""
    proc = run("stage", "run", "all", "--json", *quick_sets, "--set", "stages.inference_min_tokens_per_s=1", cwd=tmp_path)
    data = json.loads(proc.stdout)
    failing = [(r["stage"], c["name"]) for r in data["reports"] for c in r["checks"] if c["status"] == "fail"]
    assert failing in ([], [(8, "reward distribution not degenerate")]), (failing, proc.stderr[-2000:])
    assert proc.returncode == data["exit_code"] == (1 if failing else 0)
    assert [r["stage"] for r in data["reports"]] == list(range(9))
    assert all(c["hint"].strip() for r in data["reports"] for c in r["checks"] if c["status"] == "fail")
    reports = Path(tmp_path, data["run_dir"], "reports")
    for n in range(9):
        report = json.loads((reports / f"stage-{n}.json").read_text())
        assert report["schema_version"] == 2 and report["stage"] == n
        assert (reports / f"stage-{n}.md").read_text().startswith(f"# Stage {n}:")
    stage8 = {c["name"]: c for c in json.loads((reports / "stage-8.json").read_text())["checks"]}
    for name in ("loss finite", "checkpoint written", "reloaded and resumed", "no trajectory stored twice"):
        assert stage8[name]["status"] == "pass", (name, stage8[name]["detail"][-600:])
    assert stage8["reloaded and resumed"]["measured"]["start_step"] == 2  # stages.smoke_steps
    meta = json.loads(Path(tmp_path, data["run_dir"], "meta.json").read_text())
    assert meta["config_source"] == "built-in defaults" and meta["config_hash"]


def test_init_then_validate_then_break_it(tmp_path):
    assert run("init", cwd=tmp_path).returncode == 0
    assert run("config", "validate", cwd=tmp_path).returncode == 0
    cfg = tmp_path / "agentrl.yaml"
    cfg.write_text(cfg.read_text().replace("concurrency: 64", "concurrency: sixty-four"))
    proc = run("config", "validate", cwd=tmp_path)
    assert proc.returncode == 2
    assert "rollout.concurrency" in proc.stderr and "Traceback" not in proc.stderr


def test_python_dash_m_entry_point(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "agentrl_cli", "--version"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("agentrl ")
