"""Stage 8 in order: `--phase full` needs a passing short run and stage 0 baseline of the same
configuration (the config hash less the phase budgets), is refused naming what is missing (exit 2),
and runs anyway with --force, which its report records; verify's convergence layer reads a full run
as it reads a short one. (The full phase trained on the tiny model: tests/e2e/test_stage8_full.py.)"""

from __future__ import annotations

import json

from agentrl_cli.acceptance.phase_order import ORDER_HASH, find_earlier, order_hash, require_earlier
from agentrl_cli.acceptance.run_meta import create_run
from agentrl_cli.config import load_config
from agentrl_cli.core.errors import UsageError
from agentrl_cli.core.report import Check, CheckStatus, StageReport, atomic_write_text, write_report


def _loaded(tmp_path, *sets: str):
    return load_config(None, [f"observe.runs_dir={tmp_path / 'runs'}", *sets], env={})


def _ran(loaded, stage: int, phase: str | None = None, status: str = "pass", record_hash: bool = True):
    """A run of `loaded` whose stage `stage` report has `status` (what the runbook writes)."""
    run = create_run(loaded, command=["test"])
    environment = {"phase": phase} if phase else {}
    if record_hash:
        environment[ORDER_HASH] = order_hash(loaded.resolved())
    report = StageReport(stage=stage, title="t", status=status, checks=[Check("c", status)], started_at="now",
                         duration_s=1.0, run_id=run.run_id, config_hash=loaded.hash, environment=environment)
    write_report(report, run.reports)
    return run


def test_full_is_refused_naming_the_missing_short_run_and_the_command_that_makes_it(tmp_path):
    loaded = _loaded(tmp_path)
    _ran(loaded, 0)
    _ran(loaded, 8, "smoke")  # a passing smoke is not a short
    _ran(loaded, 8, "short", status="fail")  # nor is a failing short
    try:
        require_earlier(loaded.resolved(), tmp_path / "runs")
    except UsageError as exc:
        assert "a passing stage 8 short run" in exc.message and "baseline" not in exc.message
        assert order_hash(loaded.resolved()) in exc.message
        assert "`agentrl stage run 8 --phase short`" in exc.hint and "--force" in exc.hint
    else:
        raise AssertionError("full was not refused")


def test_the_step_budget_and_stage_settings_may_differ_but_the_training_settings_may_not(tmp_path):
    short, baseline = _ran(_loaded(tmp_path, "training.total_steps=5", "stages.short_minutes=1"), 8, "short"), \
        _ran(_loaded(tmp_path, "stages.smoke_steps=3"), 0)
    full = _loaded(tmp_path, "training.total_steps=5000", "stages.full_minutes=60", "inference.port=31234",
                   "training.master_port=29777")  # where it listens is no part of what it trains
    earlier = require_earlier(full.resolved(), tmp_path / "runs")
    assert earlier.found == {"stage 8 short": short.run_id, "stage 0 baseline": baseline.run_id}
    assert earlier.check(forced=False).status == CheckStatus.PASS
    other = _loaded(tmp_path, "training.learning_rate=0.5")
    assert [w.label for w in find_earlier(other.resolved(), tmp_path / "runs").missing] == ["stage 8 short", "stage 0 baseline"]


def test_a_report_written_before_order_hashes_is_matched_through_its_run_s_meta(tmp_path):
    loaded = _loaded(tmp_path)
    _ran(loaded, 8, "short", record_hash=False)
    stale = _ran(loaded, 0, record_hash=False)
    create_run(_loaded(tmp_path, "training.learning_rate=0.5"), stale.run_id, command=["test"])  # its meta now holds another config
    assert [w.label for w in find_earlier(loaded.resolved(), tmp_path / "runs").missing] == ["stage 0 baseline"]


def test_a_forced_full_run_records_what_was_missing_as_info_never_as_a_pass(tmp_path):
    loaded = _loaded(tmp_path)
    _ran(loaded, 0)
    earlier = find_earlier(loaded.resolved(), tmp_path / "runs")
    forced, refused = earlier.check(forced=True), earlier.check(forced=False)
    assert forced.status == CheckStatus.INFO and "stage 8 short" in forced.detail and forced.measured["forced"] is True
    assert refused.status == CheckStatus.FAIL and "agentrl stage run 8 --phase short" in refused.hint


def test_the_command_refuses_full_out_of_order_with_exit_2_before_creating_a_run(cli, tmp_path):
    result = cli("stage", "run", "8", "--phase", "full", "--set", f"observe.runs_dir={tmp_path / 'runs'}")
    assert result.exit_code == 2
    assert "stage 8 short" in result.stderr and "stage 0 baseline" in result.stderr
    assert "agentrl stage run 0`, then `agentrl stage run 8 --phase short" in result.stderr
    assert not (tmp_path / "runs").exists()


def _evals(rate: float) -> dict:
    return {k: v for h in ("terminal_like", "code_sandbox_like")
            for k, v in ((f"eval/{h}/success_rate", rate), (f"eval/{h}/episodes", 8))}


def test_verify_s_convergence_layer_judges_a_full_run_as_it_judges_a_short_one(tmp_path):
    from agentrl_cli.acceptance.verify.core import verify

    loaded = _loaded(tmp_path)
    judged = {}
    for phase in ("short", "full"):
        run = _ran(loaded, 8, phase)
        rows = [{"step": 0, **_evals(0.25)},
                *({"step": i, "train/loss": 0.5, "reward/mean": 0.1 * i, "train/entropy": 2.0, "train/grad_norm": 1.0}
                  for i in range(1, 7)),
                {"step": 6, **_evals(0.875)}]
        atomic_write_text(run.path / "stage8" / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
        report = verify(loaded, run, layers=["convergence"], measure=False)
        judged[phase] = (report.judged, [(c.name, c.status, c.measured) for c in report.layers["convergence"]])
    assert judged["full"][0] == "6 trainer steps from stage8 metrics (%s)" % (tmp_path / "runs" / run.run_id / "stage8")
    assert judged["full"][1] == judged["short"][1]
    assert {name: status for name, status, _ in judged["full"][1]}["evaluation success rises (95% lower bound > 0)"] == "pass"
