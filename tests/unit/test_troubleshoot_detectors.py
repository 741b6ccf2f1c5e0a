"""Run diagnosis beyond the verify faults: tool failures rising by tool and status, environment
creation failures by error, state leaking through reset, evaluation far below training, and the
weight sync's mismatch, each ranked first on a run that shows it."""

from __future__ import annotations

from agentrl_cli.acceptance.troubleshoot.diagnose import diagnose
from tests.unit.test_verify_faults import evals, loaded_config, make_run, rows, trajectory


def _top(run, loaded):
    findings = diagnose(run, loaded.config)
    assert findings
    return findings[0]


def test_rising_tool_failures_are_named_by_tool_and_status(tmp_path):
    loaded = loaded_config(tmp_path)
    metrics = rows()
    for i, r in enumerate(metrics, 1):
        r["env/terminal_like/tool/bash/ok"] = 10 * i
        r["env/terminal_like/tool/bash/timeout"] = (i * i) // 2  # grows faster every step
    top = _top(make_run(loaded, metrics=metrics), loaded)
    assert top.entry.id == "tool-failure-rate-high"
    figures = top.hits[0][1].evidence
    assert "bash:timeout" in figures["tool/failures_by_status"] and figures["second_half"] > figures["first_half"]


def test_environment_creation_failures_are_grouped_by_error(tmp_path):
    loaded = loaded_config(tmp_path)
    metrics = rows()
    metrics[-1]["env/code_sandbox_like/create_failures/SandboxError"] = 30
    top = _top(make_run(loaded, metrics=metrics), loaded)
    assert top.entry.id == "env-creation-failures"
    assert top.hits[0][1].evidence["env/creation_errors"] == {"code_sandbox_like: SandboxError": 30}


def test_initial_observations_that_differ_for_one_task_are_a_state_leak(tmp_path):
    loaded = loaded_config(tmp_path)

    def leaky(run_id):
        out = []
        for i in range(12):
            t = trajectory(run_id, i, [0.0, 1.2][i % 2])
            t.initial_observation = f"Compute task {i % 6} (leftover file from episode {i})"
            out.append(t)
        return out
    top = _top(make_run(loaded, trajectories=leaky), loaded)
    assert top.entry.id == "env-state-leak" and top.hits[0][1].evidence["tasks_affected"] == 6


def test_evaluation_far_below_training_and_a_high_mismatch_kl_are_found(tmp_path):
    loaded = loaded_config(tmp_path)
    metrics = rows(reward=lambda i: 0.3 + 0.035 * i)  # training success climbs 0.34 -> 1.0 ...
    flat = {"terminal_like": 0.3, "code_sandbox_like": 0.3, "tool_api_like": 0.3}  # ... evaluation stays where it was
    top = _top(make_run(loaded, metrics=metrics, eval_rows=evals(flat, flat)), loaded)
    assert top.entry.id == "eval-train-gap" and top.hits[0][1].evidence["gap_widened"] > 0.5
    steady = rows(reward=lambda i: 0.9)  # a gap there from the start is the sampling difference, not a mismatch
    assert "eval-train-gap" not in {f.entry.id for f in diagnose(make_run(loaded, metrics=steady), loaded.config)}
    metrics = rows()
    for r in metrics:
        r["train/mismatch_kl"] = 0.4
    top = _top(make_run(loaded, metrics=metrics), loaded)
    assert top.entry.id == "bad-after-weight-sync" and "mismatch_kl" in top.hits[0][1].summary


def test_a_run_stopped_by_a_harness_ranks_that_harness_first_naming_the_method(tmp_path):
    from agentrl_cli.core.report import Check, StageReport, write_report

    loaded = loaded_config(tmp_path)
    metrics = rows()
    metrics[-1]["env/my_env/harness_errors/step"] = 8
    run = make_run(loaded, metrics=metrics)
    stopped = Check("whole loop once: rollout, reward, train step, weight sync", "fail", None, "2 steps",
                    "Traceback ...\nHarnessFailed: harness 'my_env': step() raised in 8 episodes in a row: "
                    "AttributeError: 'Env' object has no attribute 'evidence' at env.py:12 in step", "fix the harness's step()")
    write_report(StageReport(stage=0, title="baseline", status="fail", checks=[stopped], started_at="", duration_s=1.0,
                             run_id=run.run_id, config_hash="", environment={}), run.reports)
    top = _top(run, loaded)
    assert top.entry.id == "harness-code-failing"
    hit = top.hits[0][1]
    assert "my_env" in hit.summary and "step()" in hit.summary and "AttributeError" in hit.summary
    assert hit.evidence["env/harness_errors"] == {"my_env.step()": 8} and hit.evidence["failed_check"].startswith("stage 0")


def test_masked_harness_errors_without_a_stop_are_found_per_method(tmp_path):
    loaded = loaded_config(tmp_path)
    metrics = rows()
    for i, r in enumerate(metrics, 1):
        r["env/my_env/harness_errors/compute_reward"] = i
    findings = diagnose(make_run(loaded, metrics=metrics), loaded.config)
    found = next(f for f in findings if f.entry.id == "harness-code-failing")
    assert found.hits[0][1].evidence["env/harness_errors"] == {"my_env.compute_reward()": len(metrics)}
