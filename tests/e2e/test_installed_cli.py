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
    proc = run("stage", "run", "all", "--json", *quick_sets, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    data = json.loads(proc.stdout)
    assert len(data["reports"]) == 9
    assert len(list(Path(tmp_path, data["run_dir"], "reports").glob("stage-*.json"))) == 9


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
