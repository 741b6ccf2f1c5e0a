"""Which engine versions passed the conformance check: the pinned ones, and passes recorded by
`agentrl engine verify`; stage 4's version check passes a verified version and, for one that never
passed, is a skip (a failure under --strict) naming the version and the command that verifies it."""

from __future__ import annotations

import json

from agentrl_cli.core.report import CheckStatus, apply_strict
from agentrl_cli.engines.conformance import VERIFIED
from agentrl_cli.engines.conformance.check import Conformance
from agentrl_cli.engines.conformance.record import conformance_check, passes, record_pass, verified, version_check


def test_a_version_that_never_passed_is_named_with_the_command_and_fails_under_strict(tmp_path):
    check = version_check("vllm", "0.34.1", "/opt/vllm/bin/python", tmp_path)
    assert check.status == CheckStatus.SKIP and "vllm 0.34.1 has never passed" in check.detail
    assert check.hint == "agentrl engine verify --engine vllm --python /opt/vllm/bin/python"
    assert check.measured["verified"] == [VERIFIED["vllm"]]
    [strict] = apply_strict([check])
    assert strict.status == CheckStatus.FAIL


def test_the_pinned_version_passes_and_a_recorded_pass_counts_from_then_on(tmp_path):
    assert version_check("sglang", VERIFIED["sglang"], "python3", tmp_path).status == CheckStatus.PASS
    result = Conformance("vllm", "0.34.1", "/opt/vllm/bin/python",
                         [{"kind": "route", "what": "generate", "ok": True, "path": "source", "problem": "", "where": "x"}])
    path = record_pass(result, tmp_path)
    assert json.loads(path.read_text())["passes"][0]["version"] == "0.34.1" and len(passes(tmp_path)) == 1
    record_pass(result, tmp_path)  # once per engine and version
    assert len(passes(tmp_path)) == 1 and verified(tmp_path)["vllm"] == [VERIFIED["vllm"], "0.34.1"]
    check = version_check("vllm", "0.34.1", "/opt/vllm/bin/python", tmp_path)
    assert check.status == CheckStatus.PASS and "verified here" in check.expected


def test_a_failed_conformance_names_each_problem_and_where_the_engine_defines_it():
    result = Conformance("sglang", "0.5.23", "py", [
        {"kind": "body", "what": "generate", "ok": False, "path": "imported", "problem": "unknown field 'input_idz'",
         "where": "sglang.srt.managers.io_struct:177 GenerateReqInput"},
        {"kind": "route", "what": "health", "ok": True, "path": "source", "problem": "", "where": ""}])
    check = conformance_check(result)
    assert check.status == CheckStatus.FAIL and "input_idz" in check.detail and "io_struct:177" in check.detail
    assert check.measured["read"] == "imported+source"


def test_the_image_lock_lists_the_verified_engine_versions(tmp_path):
    from agentrl_cli.config.models import PlatformConfig
    from agentrl_cli.ops.image.lock import build_lock

    cfg = PlatformConfig()
    lock = build_lock(cfg.image, "vllm", "", str(tmp_path))
    assert lock["verified_engines"] == {name: [version] for name, version in VERIFIED.items()}
    assert "vllm" in lock["roles"]["inference"]["roots"]


def test_engine_verify_refuses_an_engine_with_nothing_of_its_own_to_check(cli):
    result = cli("engine", "verify", "--engine", "hf")
    assert result.exit_code == 2 and "sglang or --engine vllm" in result.stderr
