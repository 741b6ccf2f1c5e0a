"""`agentrl select`'s scorecard logic: the thresholds each criterion is judged against, what counts as
measured (and so the exit code), the stress table's fit, and the JSON and Markdown shapes."""

from __future__ import annotations

import pytest

from agentrl_cli.core.report import Check, CheckStatus
from agentrl_cli.acceptance.select import probes, stress
from agentrl_cli.acceptance.select.scorecard import CRITERIA, Scorecard, cell_name

LOOP = {"steps": 3, "mode": "async", "max_staleness": 1, "timed_fraction": 0.95, "phases_every_step": True,
        "seconds": {"sampling": 1.0, "training": 0.5, "sync": 0.05}, "tokens_per_s": 100.0, "policy_lag_per_step": [0.0, 1.0, 0.0],
        "episodes": 12, "sync_share_of_step": 0.03, "sync_s": 0.05, "step_s": 1.6, "verified_syncs": 3}
ABORT = {"requested_tokens": 160, "abort_sent_mid_decode": True, "pieces_tokens": [10, 150], "generated_tokens": 160,
         "aborted_generations": 1, "resumed_generations": 1, "wasted_tokens": 0, "token_exact_vs_uninterrupted": True}


def card(statuses: dict[tuple[str, str], Check]) -> Scorecard:
    return Scorecard(["deepspeed", "fsdp"], ["throughput", "checkpoint"], statuses, run_id="r1")


def full(check_for) -> dict:
    return {(c, b): check_for(c, b) for c in ("throughput", "checkpoint") for b in ("deepspeed", "fsdp")}


def test_every_cell_measured_exits_0_even_when_a_criterion_fails():
    cells = full(lambda c, b: Check.judge(cell_name(c, b), b == "deepspeed", {"x": 1}, "x", "do y"))
    cells[("checkpoint", "fsdp")] = Check.info("c", {"v": 2})
    sc = card(cells)
    assert sc.complete and sc.exit_code == 0 and sc.unmeasured() == []


@pytest.mark.parametrize("bad", [Check.skipped("s", "training.backend 'fsdp' is not installed"),
                                 Check.crashed("c", RuntimeError("boom"))])
def test_a_skipped_or_crashed_cell_is_unmeasured_and_exits_1(bad):
    cells = full(lambda c, b: Check.judge(cell_name(c, b), True, 1, "x", "y"))
    cells[("checkpoint", "fsdp")] = bad
    sc = card(cells)
    assert not sc.complete and sc.exit_code == 1
    assert sc.unmeasured() == [{"criterion": "checkpoint", "backend": "fsdp", "status": str(bad.status),
                                "why": bad.detail.splitlines()[0]}]


def test_a_missing_cell_is_unmeasured():
    sc = card({("throughput", "deepspeed"): Check.judge("t", True, 1, "x", "y")})
    assert len(sc.unmeasured()) == 3 and sc.exit_code == 1


def test_json_and_markdown_shapes():
    cells = full(lambda c, b: Check.judge(cell_name(c, b), True, {"v": 1}, "threshold", "action", "how it was measured"))
    sc = card(cells)
    sc.tables["parallel"] = [{"backend": "deepspeed", "strategy": "zero2", "ranks": 2, "status": "ok",
                              "points": [{"mbs": 1, "peak_mib": 100.0, "step_s": 0.1}, {"mbs": 2, "peak_mib": 110.0, "step_s": 0.2}],
                              "fit": {"a_mib": 90.0, "b_mib": 10.0}, "max_micro_batch": 3}]
    d = sc.to_dict()
    assert d["schema_version"] == 1 and d["complete"] and d["exit_code"] == 0 and d["backends"] == ["deepspeed", "fsdp"]
    assert [c["key"] for c in d["criteria"]] == ["throughput", "checkpoint"]
    cell = d["criteria"][0]["results"]["fsdp"]
    assert cell["status"] == "pass" and cell["expected"] == "threshold" and cell["detail"] == "how it was measured"
    assert all(c["action"] for c in d["criteria"])
    md = sc.to_markdown()
    assert "| criterion | deepspeed | fsdp | deployment action |" in md
    assert "| zero2 | 2 | ok | 1: 100, 2: 110 | 1: 0.100, 2: 0.200 | 90 + 10.0·mbs | 3 |" in md
    assert md.count("How each was measured") == 2


def test_the_eight_criteria_each_carry_a_deployment_action():
    assert len(CRITERIA) == 8 and len({c.key for c in CRITERIA}) == 8 and all(c.action and c.why for c in CRITERIA)


def test_fit_and_largest_micro_batch():
    f = stress.fit([{"mbs": 1, "peak_mib": 110.0}, {"mbs": 2, "peak_mib": 120.0}, {"mbs": 4, "peak_mib": 140.0}])
    assert f["a_mib"] == pytest.approx(100.0) and f["b_mib"] == pytest.approx(10.0)
    assert stress.largest_micro_batch(f, 1024.0) == 92  # (1024 - 100) / 10
    assert stress.largest_micro_batch(f, 50.0) == 0  # even the fixed part is over the budget
    assert stress.largest_micro_batch({"a_mib": 5.0, "b_mib": 0.0}, 100.0) is None  # no growth: no bound
    assert stress.fit([{"mbs": 2, "peak_mib": 1.0}, {"mbs": 2, "peak_mib": 2.0}]) is None


def test_combine_takes_the_highest_peak_and_slowest_step_over_ranks():
    ranks = [{"points": [{"mbs": 1, "peak_mib": 10.0, "step_s": 0.2}]}, {"points": [{"mbs": 1, "peak_mib": 12.0, "step_s": 0.1}]}]
    assert stress.combine(ranks) == [{"mbs": 1, "peak_mib": 12.0, "step_s": 0.2}]


def test_strategies_per_backend():
    assert [s for s, _ in stress.strategies("deepspeed")] == ["zero0", "zero1", "zero2", "zero3"]
    assert stress.strategies("fsdp") == [("fsdp", {"backend": "fsdp"})]


def test_throughput_threshold_is_the_timed_fraction():
    assert probes.throughput_check("deepspeed", LOOP).status == CheckStatus.PASS
    assert probes.throughput_check("deepspeed", {**LOOP, "timed_fraction": 0.79}).status == CheckStatus.FAIL
    assert probes.throughput_check("deepspeed", {**LOOP, "phases_every_step": False}).status == CheckStatus.FAIL


def test_decoupled_needs_observed_lag_and_an_exact_resume():
    assert probes.decoupled_check("fsdp", LOOP, ABORT).status == CheckStatus.PASS
    assert probes.decoupled_check("fsdp", {**LOOP, "policy_lag_per_step": [0.0, 0.0, 0.0]}, ABORT).status == CheckStatus.FAIL
    assert probes.decoupled_check("fsdp", LOOP, {**ABORT, "token_exact_vs_uninterrupted": False}).status == CheckStatus.FAIL
    assert probes.decoupled_check("fsdp", LOOP, {**ABORT, "wasted_tokens": 4}).status == CheckStatus.FAIL


def test_weight_sync_share_threshold():
    assert probes.weight_sync_check("deepspeed", LOOP, 0.3).status == CheckStatus.PASS
    assert probes.weight_sync_check("deepspeed", {**LOOP, "sync_share_of_step": 0.31}, 0.3).status == CheckStatus.FAIL
    assert probes.weight_sync_check("deepspeed", {**LOOP, "verified_syncs": 2}, 0.3).status == CheckStatus.FAIL


def _row(strategy, ranks, fits=True, status="ok"):
    return {"strategy": strategy, "ranks": ranks, "status": status, "fits_budget_at_smallest": fits, "max_micro_batch": 4,
            "points": [{"mbs": 1, "peak_mib": 10.0, "step_s": 0.1}], "error": None if status == "ok" else "exit status 1"}


def test_parallel_needs_every_strategy_to_run_and_one_to_fit():
    assert probes.parallel_check("fsdp", [_row("fsdp", 1), _row("fsdp", 2, fits=False)], 8, [1, 2]).status == CheckStatus.PASS
    assert probes.parallel_check("fsdp", [_row("fsdp", 1), _row("fsdp", 2, status="error")], 8, [1, 2]).status == CheckStatus.FAIL
    assert probes.parallel_check("fsdp", [_row("fsdp", 1, fits=False)], 8, [1]).status == CheckStatus.FAIL
    assert probes.parallel_check("fsdp", [], 8, [1]).status == CheckStatus.SKIP  # --strategies left it none


def test_checkpoint_needs_own_resume_and_every_kept_fixture_of_its_format():
    own = {"ok": True, "restored_step": 1, "relative_difference": 0.0}
    refused = {"fixture": "checkpoint-v1", "loaded": False, "why": "written by deepspeed"}
    ok = probes.checkpoint_check("fsdp", {"own_resume": own, "kept_fixtures": [], "other_backends": [refused]})
    assert ok.status == CheckStatus.PASS and "not verified" in ok.detail  # no fixture of its own yet: said so
    assert ok.measured["other_backends"]["checkpoint-v1"].startswith("refused")
    kept_bad = {**refused, "loaded": False}
    assert probes.checkpoint_check("deepspeed", {"own_resume": own, "kept_fixtures": [kept_bad], "other_backends": []}
                                   ).status == CheckStatus.FAIL
    assert probes.checkpoint_check("deepspeed", {"own_resume": {**own, "ok": False}, "kept_fixtures": [], "other_backends": []}
                                   ).status == CheckStatus.FAIL


def test_maintenance_fails_a_prerelease_and_says_the_age_is_unknown():
    meta = {"installed": True, "version": "1.0.0", "final_release": True, "development_status": "5 - Production/Stable",
            "source_revision": None, "installed_at": "2026-01-01", "release_date": None, "issue_tracker": None, "source": None}
    good = probes.maintenance_check("fsdp", {"torch": meta})
    assert good.status == CheckStatus.PASS and "unknown" in good.detail
    assert probes.maintenance_check("fsdp", {"torch": {**meta, "final_release": False}}).status == CheckStatus.FAIL
    assert probes.maintenance_check("fsdp", {"torch": {**meta, "development_status": "3 - Alpha"}}).status == CheckStatus.FAIL
    assert probes.maintenance_check("x", {}).status == CheckStatus.SKIP


def test_dependencies_fail_on_a_licence_outside_the_allowed_list():
    deps = {"roots": ["deepspeed"], "missing": [], "packages": 3, "beyond_torch": 1, "licences": {"MIT": 2, "GPL-3.0": 1},
            "outside_allowed": {"x": "GPL-3.0"}, "source": "this environment"}
    assert probes.dependencies_check("deepspeed", deps).status == CheckStatus.FAIL
    assert probes.dependencies_check("deepspeed", {**deps, "outside_allowed": {}}).status == CheckStatus.PASS


def test_a_backend_not_in_backends_is_not_installed():
    assert "not installed" in probes.not_installed("nope")
    assert probes.not_installed("deepspeed") is None


def test_a_shared_measurement_that_raised_fails_every_cell_that_needs_it_with_its_traceback():
    def boom():
        raise RuntimeError("loop died")
    m = probes.Measured(boom)
    first = probes._guard("a", lambda: probes.throughput_check("deepspeed", m.get()))
    second = probes._guard("b", lambda: probes.weight_sync_check("deepspeed", m.get(), 0.3))
    assert first.status == second.status == CheckStatus.FAIL and first.measured is None
    assert first.detail == second.detail and "loop died" in first.detail


@pytest.mark.parametrize("args", [["--backends", "nope"], ["--criteria", "speed"], ["--micro-batches", "2"],
                                  ["--stress-ranks", "0"], ["--strategies", "zero4"]])
def test_bad_options_are_usage_errors(cli, args):
    result = cli("select", *args)
    assert result.exit_code == 2, result.output
