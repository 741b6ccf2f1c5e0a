"""Reports: status rules, strict mode, containment of crashing checks, JSON and Markdown views."""

from __future__ import annotations

import json

import pytest

from agentrl_cli.core.report import (SCHEMA_VERSION, Check, StageReport, apply_strict, guarded, read_report,
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


def test_report_round_trips_through_json(tmp_path):
    report = _report([Check.judge("a", True, 2.5, ">= 1", "raise it"), Check.skipped("b", "why")])
    json_path, md_path = write_report(report, tmp_path)
    data = json.loads(json_path.read_text())
    assert data["schema_version"] == SCHEMA_VERSION
    assert data["counts"] == {"pass": 1, "fail": 0, "skip": 1, "info": 0}
    again = read_report(json_path)
    assert again == report
    md = md_path.read_text()
    assert "# Stage 3: control plane — PASS" in md and "| a | pass | 2.5 | >= 1 |" in md and "why" in md


def test_markdown_lists_failures_with_what_to_do():
    report = _report([Check.judge("bandwidth", False, 0.01, ">= 1 GB/s", "check the NIC")])
    md = report.to_markdown()
    assert "FAIL" in md and "what to do: check the NIC" in md


def test_info_is_neither_pass_nor_fail():
    figure = Check.info("tokens/s per stream", 12.5, "one episode's rate, not the server's throughput")
    ok = Check.judge("a", True, 1, ">= 1", "raise it")
    assert figure.status == "info" and not figure.hint
    assert stage_status([ok, figure]) == "pass"
    assert stage_status([figure]) == "skip"  # nothing judged: never a pass
    assert stage_status([figure, Check.judge("b", False, 0, ">= 1", "raise it")]) == "fail"
    assert apply_strict([figure])[0].status == "info"


def test_info_is_counted_and_rendered_apart(tmp_path):
    report = _report([Check.judge("a", True, 2.5, ">= 1", "raise it"), Check.info("share", 0.4, "sampling share of a step")])
    json_path, md_path = write_report(report, tmp_path)
    assert json.loads(json_path.read_text())["counts"] == {"pass": 1, "fail": 0, "skip": 0, "info": 1}
    md = md_path.read_text()
    assert "| share | info | 0.4 |" in md and "## Reported, not judged" in md and "Failures and skips" not in md
    assert read_report(json_path) == report


def test_a_version_1_report_still_reads_and_an_unknown_version_is_refused(tmp_path):
    data = _report([Check.judge("a", True, 1, ">= 1", "x")]).to_dict()
    data["schema_version"] = 1
    assert StageReport.from_dict(data).checks[0].status == "pass"
    data["schema_version"] = 99
    with pytest.raises(ValueError, match="schema_version 99"):
        StageReport.from_dict(data)


def test_rich_view_shows_info_without_a_failure_line():
    from rich.console import Console

    from agentrl_cli.cli.render import render_report

    console = Console(record=True, width=200)
    render_report(console, _report([Check.info("share", 0.4, "sampling share"), Check.judge("b", False, 0, ">= 1", "fix b")]))
    text = console.export_text()
    assert "INFO" in text and "✗ b" in text and "✗ share" not in text and "○ share" not in text
