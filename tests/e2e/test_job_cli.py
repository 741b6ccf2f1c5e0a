"""`agentrl job ...` and `agentrl controlplane ...` as a user runs them, on the default local executor and SQLite."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

COMMANDS = [("job", "submit"), ("job", "list"), ("job", "show"), ("job", "cancel"), ("job", "logs"),
            ("controlplane", "serve"), ("controlplane", "status"), ("controlplane", "render"), ("controlplane", "validate")]


@pytest.mark.parametrize("group, command", COMMANDS)
def test_every_command_has_json_and_examples_in_its_help(cli, group, command):
    result = cli(group, command, "--help")
    assert result.exit_code == 0 and "--json" in result.stdout and "Examples" in result.stdout


def submit(cli, *args: str):
    """`agentrl job submit --json ARGS` (--json before the `--` that starts the command)."""
    result = cli("job", "submit", "--json", *args)
    return result, json.loads(result.stdout)


def test_a_no_op_job_runs_in_the_named_pool_and_its_output_is_kept(cli):
    result, job = submit(cli, "--pool", "train", "--wait", "--timeout", "60", "--",
                           "sh", "-c", "echo ran in $AGENTRL_JOB_POOL")
    assert result.exit_code == 0 and job["state"] == "succeeded" and job["pool"] == "train" and job["exit_code"] == 0
    result, logs = cli.json("job", "logs", job["id"])
    assert logs["log"] == "ran in train\n"
    result, shown = cli.json("job", "show", job["id"])
    assert shown["fence"] >= 1 and shown["started_at"] and shown["ended_at"]
    result, listed = cli.json("job", "list", "--all")
    assert [j["id"] for j in listed] == [job["id"]]
    _, config = cli.json("config", "show")
    audit = [json.loads(line) for line in (Path(config["config"]["observe"]["runs_dir"]) / "audit.jsonl").read_text().splitlines()]
    assert [(a["service"], a["endpoint"], a["outcome"]) for a in audit] == [("controlplane", "job submit", "ok")]
    assert audit[0]["client"].startswith("local:")


def test_a_failing_job_reports_its_exit_code_and_wait_exits_1(cli):
    result, job = submit(cli, "--pool", "rollout", "--wait", "--timeout", "60", "--", "sh", "-c", "exit 3")
    assert result.exit_code == 1 and job["state"] == "failed" and job["exit_code"] == 3 and job["reason"] == "exit code 3"


def test_over_quota_a_job_waits_with_the_reason_and_cancel_stops_the_running_one(cli):
    result, first = submit(cli, "--pool", "train", "--", "sleep", "600")
    assert first["state"] == "running"
    result, second = submit(cli, "--pool", "train", "--", "sleep", "600")
    assert second["state"] == "pending" and second["reason"].startswith("Quota: pool train runs 1 of its quota of 1")
    pid = int(open(f"runs/jobs/local/{first['id']}/pid").read().split()[0])
    result, cancelled = cli.json("job", "cancel", first["id"])
    assert result.exit_code == 0 and cancelled["state"] == "cancelled"
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
    result, second = cli.json("job", "show", second["id"])
    assert second["state"] == "running"
    cli("job", "cancel", second["id"])


@pytest.mark.parametrize("args, words, fix", [
    (["--pool", "nosuch", "--", "true"], "pool 'nosuch' does not exist", "use one of: rollout, train"),
    (["--pool", "train", "--priority", "urgent", "--", "true"], "priority 'urgent' does not exist", "use one of: low, high"),
    (["--pool", "train"], "no command to run", "after `--`"),
    (["--pool", "train", "--cpus", "9", "--", "true"], "--cpus 9 is more than pool train has (2)", "at most 2"),
])
def test_bad_submissions_are_refused_with_the_fix(cli, args, words, fix):
    result = cli("job", "submit", *args)
    assert result.exit_code == 2 and words in result.stderr and fix in result.stderr and "Traceback" not in result.output


def test_slurm_where_slurm_is_not_installed_is_a_clear_error(cli, tmp_path):
    result = cli("job", "submit", "--pool", "train", "--set", "controlplane.executor=slurm", "--", "true",
                 env={"PATH": str(tmp_path)})
    assert result.exit_code == 2 and "Slurm's commands are not installed here" in result.stderr
    assert "controlplane.executor: local" in result.stderr and "Traceback" not in result.output


def test_an_unknown_job_and_a_store_that_cannot_open_are_clear_errors(cli, tmp_path):
    result = cli("job", "show", "j-nosuch")
    assert result.exit_code == 2 and "job 'j-nosuch' does not exist" in result.stderr and "agentrl job list" in result.stderr
    (tmp_path / "f").write_text("")
    result = cli("controlplane", "status", "--set", f"controlplane.state_store=sqlite:///{tmp_path}/f/state.db")
    assert result.exit_code == 2 and "cannot be opened" in result.stderr and "fix:" in result.stderr


def test_status_without_a_live_leader_exits_1_and_says_how_to_start_one(cli):
    result, view = cli.json("controlplane", "status")
    assert result.exit_code == 1 and view["leader"] == "" and view["schema_version"] >= 1
