"""What was written before the typed seams still loads: a stage report written by the code before
`CheckStatus` (tests/golden/stage5_report_v2.json), a config naming the backend and transport as
the Literal keys did, and a harness that reports its tool calls as dicts in
`Observation.info["calls"]` (the shape before `Observation.calls`)."""

from __future__ import annotations

import json
from pathlib import Path

from agentrl_cli.config import load_config
from agentrl_cli.runtime.data.record_from_episode import record_from_episode
from agentrl_cli.core.report import FAIL, PASS, STATUSES, CheckStatus, StageReport, read_report
from harnesses.base import Action, Observation, TaskSpec, Trajectory

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "stage5_report_v2.json"


def test_a_report_written_before_check_status_reads_and_writes_back_the_same():
    report = read_report(GOLDEN)
    assert report.status == CheckStatus.FAIL and [c.status for c in report.checks] == ["pass", "fail", "skip", "info"]
    assert json.loads(json.dumps(report.to_dict())) == json.loads(GOLDEN.read_text())
    assert isinstance(StageReport.from_dict(report.to_dict()).checks[0].status, CheckStatus)
    assert (PASS, FAIL) == ("pass", "fail") and STATUSES == ("pass", "fail", "skip", "info")  # the old names


def test_a_config_naming_backend_and_transport_as_before_loads(tmp_path):
    path = tmp_path / "agentrl.yaml"
    path.write_text("training:\n  backend: deepspeed\n  weight_sync: distributed\n", encoding="utf-8")
    cfg = load_config(path, [], env={}).config
    assert (cfg.training.backend, cfg.training.weight_sync) == ("deepspeed", "distributed")


def test_tool_calls_reported_in_info_as_before_are_stored_with_their_name_arguments_and_status():
    task = TaskSpec("t/1", "legacy", "do it", "4", 1, "train", {"family": "f"})
    obs = Observation(text="ran", info={"calls": [
        {"tool": "run_shell", "arguments": {"command": "ls"}, "duration_s": 0.25, "exit_code": 0},
        {"tool": "run_shell", "arguments": {"command": "false"}, "exit_code": 1, "retries": 2},
        {"tool": "lookup", "status": "rate_limited", "latency_ms": 12.0},
    ]})
    traj = Trajectory(task=task, actions=[Action(text="x")], observations=[Observation(text="start"), obs])
    calls = record_from_episode(traj, run_id="r", harness_version="1").steps[0].tool_calls
    assert [(c.name, json.loads(c.arguments), c.status) for c in calls] == [
        ("run_shell", {"command": "ls"}, "ok"), ("run_shell", {"command": "false"}, "error"), ("lookup", {}, "rate_limited")]
    assert [c.latency_ms for c in calls] == [250.0, 0.0, 12.0] and calls[1].retries == 2
