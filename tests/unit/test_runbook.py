"""Runbook: stage selection, order, containment of broken stages, prerequisites, exit codes."""

from __future__ import annotations

import json
import sys
import types

import pytest

from agentrl_cli.acceptance import runbook
from agentrl_cli.config import load_config
from agentrl_cli.acceptance.context import StageOptions
from agentrl_cli.core.errors import UsageError
from agentrl_cli.core.report import Check
from agentrl_cli.acceptance.run_meta import create_run
from agentrl_cli.acceptance.runbook import STAGES, StageSpec, exit_code, parse_selection, run_stages


def test_nine_stages_in_order_with_modules():
    assert [s.number for s in STAGES] == list(range(9))
    for spec in STAGES:
        assert all(p < spec.number or spec.number == 0 for p in spec.prerequisites)
        assert spec.module.startswith("stages.s")


@pytest.mark.parametrize("text,expected", [
    ("all", list(range(9))), ("3", [3]), ("0..4", [0, 1, 2, 3, 4]), ("5,0,2", [0, 2, 5]), ("0..1,7..8", [0, 1, 7, 8]),
])
def test_parse_selection(text, expected):
    assert parse_selection(text) == expected


@pytest.mark.parametrize("text", ["9", "4..2", "x", "", "-1", "1..."])
def test_bad_selection_is_a_usage_error(text):
    with pytest.raises(UsageError):
        parse_selection(text)


@pytest.fixture
def fake_stages(monkeypatch):
    """Two stages backed by in-memory modules: one passes, one crashes."""
    ok = types.ModuleType("fake_ok")
    ok.run = lambda ctx: ctx.report([Check.judge("works", True, 1, "1", "n/a")])
    broken = types.ModuleType("fake_broken")

    def crash(ctx):
        raise ZeroDivisionError("oops")

    broken.run = crash
    monkeypatch.setitem(sys.modules, "fake_ok", ok)
    monkeypatch.setitem(sys.modules, "fake_broken", broken)
    specs = {0: StageSpec(0, "ok", "ok stage", "fake_ok", (), ""), 1: StageSpec(1, "broken", "broken stage", "fake_broken", (0,), "")}
    monkeypatch.setattr(runbook, "BY_NUMBER", specs)
    return specs


def test_crashing_stage_becomes_failing_report_with_traceback(fake_stages, tmp_path):
    loaded = load_config(None, [f"observe.runs_dir={tmp_path / 'runs'}"], env={})
    run = create_run(loaded, command=["test"])
    reports = run_stages([0, 1], loaded, run, StageOptions())
    assert [r.status for r in reports] == ["pass", "fail"]
    assert exit_code(reports) == 1
    data = json.loads((run.reports / "stage-1.json").read_text())
    assert "ZeroDivisionError: oops" in data["checks"][0]["detail"]
    assert "Traceback" in data["checks"][0]["detail"]
    assert data["checks"][0]["hint"]


def test_prerequisite_failure_is_noted(fake_stages, tmp_path, monkeypatch):
    fake_stages[2] = StageSpec(2, "after", "after broken", "fake_ok", (1,), "")
    loaded = load_config(None, [f"observe.runs_dir={tmp_path / 'runs'}"], env={})
    run = create_run(loaded, command=["test"])
    reports = run_stages([1, 2], loaded, run, StageOptions())
    assert any("prerequisite stage 1" in n and "failed" in n for n in reports[1].notes)
    assert any("prerequisite stage 0" in n and "not been run" in n for n in reports[0].notes)


def test_meta_json_archives_config_and_environment(tmp_path):
    loaded = load_config(None, [f"observe.runs_dir={tmp_path / 'runs'}", "inference.api_key=topsecret"], env={})
    run = create_run(loaded, command=["agentrl", "stage", "run", "all"])
    meta = json.loads(run.meta_path.read_text())
    assert meta["config_hash"] == loaded.hash
    assert meta["config"]["rollout"]["concurrency"] == loaded.config.rollout.concurrency
    assert meta["packages"]["torch"] and meta["host"]["cpu_count"] >= 1
    assert meta["seeds"] == {"rollout": 1234, "training": 1234}
    assert [h["name"] for h in meta["harnesses"]] == ["terminal_like", "code_sandbox_like", "tool_api_like"]
    assert meta["image_tags"]["terminal_like"] == "pinned-2026-08-01"
    assert "topsecret" not in run.meta_path.read_text()
