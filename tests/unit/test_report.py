"""Reports: status rules, strict mode, containment of crashing checks, JSON and Markdown views."""

from __future__ import annotations

import json

import pytest

from agentrl_cli.report import (SCHEMA_VERSION, Check, StageReport, apply_strict, guarded, read_report,
                                stage_status, write_report)


def _report(checks):
    return StageReport(stage=3, title="control plane", status=stage_status(checks), checks=checks,
                       started_at="2026-11-29T10:00:00+00:00", duration_s=1.5, run_id="r1", config_hash="abc")


def test_stage_passes_only_when_no_check_fails():
    ok = Check.judge("a", True, 1, ">= 1", "raise it")
    bad = Check.judge("b", False, 0, ">= 1", "raise it")
    skip = Check.skipped("c", "no GPU here")
    assert stage_status([ok, skip]) == "pass"
    assert stage_status([ok, bad, skip]) == "fail"
    assert stage_status([skip]) == "skip"
    assert stage_status([]) == "fail"


def test_strict_turns_skips_into_failures_with_the_reason():
    checks = apply_strict([Check.skipped("probe build", "no container builder on this host")])
    assert checks[0].status == "fail"
    assert "no container builder" in checks[0].detail and checks[0].hint


def test_unknown_status_is_rejected():
    with pytest.raises(ValueError):
        Check("x", "ok")


def test_crashing_check_becomes_failure_with_traceback():
    def boom() -> Check:
        raise RuntimeError("disk on fire")

    check = guarded("writes", boom)
    assert check.status == "fail"
    assert "RuntimeError: disk on fire" in check.detail and "Traceback" in check.detail
    assert check.hint


def test_not_implemented_fails_with_hint():
    check = Check.not_implemented("everything")
    assert check.status == "fail" and check.name == "not implemented" and check.hint


def test_report_round_trips_through_json(tmp_path):
    report = _report([Check.judge("a", True, 2.5, ">= 1", "raise it"), Check.skipped("b", "why")])
    json_path, md_path = write_report(report, tmp_path)
    data = json.loads(json_path.read_text())
    assert data["schema_version"] == SCHEMA_VERSION
    assert data["counts"] == {"pass": 1, "fail": 0, "skip": 1}
    again = read_report(json_path)
    assert again == report
    md = md_path.read_text()
    assert "# Stage 3: control plane — PASS" in md and "| a | pass | 2.5 | >= 1 |" in md and "why" in md


def test_markdown_lists_failures_with_what_to_do():
    report = _report([Check.judge("bandwidth", False, 0.01, ">= 1 GB/s", "check the NIC")])
    md = report.to_markdown()
    assert "FAIL" in md and "what to do: check the NIC" in md
