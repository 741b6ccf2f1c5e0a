"""The command line as a user drives it (through Typer's runner): exit codes, reports, errors."""

from __future__ import annotations


import pytest

pytestmark = pytest.mark.e2e


def test_help_of_every_command_shows_examples(cli):
    for args in (["init"], ["config", "show"], ["config", "validate"], ["stage", "list"], ["stage", "run"],
                 ["stage", "show"], ["verify"], ["troubleshoot"], ["runs", "list"], ["runs", "show"]):
        result = cli(*args, "--help")
        assert result.exit_code == 0, args
        assert "Examples" in result.stdout, args


def test_stage_run_reuses_named_run_and_show_reads_it(cli, isolated):
    (isolated / "bad.lock.json").write_text("{")
    result = cli("stage", "run", "2", "--run-id", "my-run", "--set", "image.lock_file=bad.lock.json")
    assert result.exit_code == 1 and "Summary" in result.stdout
    assert cli("stage", "run", "5", "--run-id", "my-run", "--set", "sandbox.bwrap=/nonexistent/bwrap").exit_code == 1
    result, data = cli.json("stage", "show", "2", "--run", "my-run")
    assert result.exit_code == 1 and data["stage"] == 2 and data["run_id"] == "my-run"
    result, runs = cli.json("runs", "list")
    assert result.exit_code == 0 and runs[0]["run_id"] == "my-run" and runs[0]["stages"] == {"2": "fail", "5": "fail"}
    result, shown = cli.json("runs", "show", "my-run")
    assert shown["meta"]["config_hash"] and set(shown["reports"]) == {"2", "5"}


def test_stage_show_without_reports_is_a_clear_error(cli):
    result = cli("stage", "show", "4")
    assert result.exit_code == 2 and "no report for stage 4" in result.stderr


@pytest.mark.parametrize("selector", ["9", "banana", "3..1"])
def test_bad_stage_selector_exits_2(cli, selector):
    result = cli("stage", "run", selector)
    assert result.exit_code == 2 and "stage" in result.stderr and "fix:" in result.stderr


def test_bad_phase_exits_2(cli):
    result = cli("stage", "run", "8", "--phase", "long")
    assert result.exit_code == 2 and "smoke, short, full" in result.stderr


BAD_CONFIGS = {
    "wrong type": ("rollout:\n  concurrency: many\n", "rollout.concurrency"),
    "unknown key": ("training:\n  seq_len_limt: 4096\n", "training.seq_len_limt"),
    "malformed yaml": ("rollout: [unclosed\n", "malformed YAML"),
    "out of range": ("reward:\n  max_retries: 99\n", "reward.max_retries"),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
@pytest.mark.parametrize("command", [["config", "validate"], ["stage", "run", "0"], ["verify"]])
def test_bad_config_exits_2_with_key_path_and_fix_and_no_traceback(cli, write_yaml, case, command):
    text, needle = BAD_CONFIGS[case]
    path = write_yaml(text, "bad.yaml")
    result = cli(*command, "--config", str(path))
    assert result.exit_code == 2
    assert needle in result.stderr and "fix:" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert len(result.stderr.splitlines()) <= 25, "the message must fit one screen"


def test_missing_config_file_exits_2(cli):
    result = cli("config", "validate", "--config", "absent.yaml")
    assert result.exit_code == 2 and "not found" in result.stderr and "agentrl init" in result.stderr


def test_bad_set_exits_2(cli):
    result = cli("config", "show", "--set", "rollout.concurrency")
    assert result.exit_code == 2 and "KEY.PATH=VALUE" in result.stderr


def test_bad_env_override_exits_2(cli):
    result = cli("config", "validate", env={"AGENTRL_TRAINING__ZERO_STAGE": "7"})
    assert result.exit_code == 2 and "AGENTRL_TRAINING__ZERO_STAGE" in result.stderr


def test_debug_variable_shows_the_traceback(cli, write_yaml):
    path = write_yaml("rollout:\n  concurrency: many\n", "bad.yaml")
    result = cli("config", "validate", "--config", str(path), env={"AGENTRL_DEBUG": "1"})
    assert result.exit_code == 2 and "Traceback" in result.stderr


def test_init_writes_template_and_refuses_to_overwrite(cli, isolated):
    assert cli("init").exit_code == 0
    written = (isolated / "agentrl.yaml").read_text()
    assert "rollout:" in written and "concurrency: 64" in written
    again = cli("init")
    assert again.exit_code == 2 and "--force" in again.stderr
    (isolated / "agentrl.yaml").write_text("rollout:\n  concurrency: 5\n")
    assert cli("init", "--force").exit_code == 0
    assert (isolated / "agentrl.yaml.bak").read_text() == "rollout:\n  concurrency: 5\n"


def test_config_show_uses_local_file_and_overrides(cli, write_yaml):
    write_yaml("rollout:\n  concurrency: 5\n")
    result, data = cli.json("config", "show", "--set", "rollout.max_staleness=1")
    assert result.exit_code == 0
    assert data["source"] == "agentrl.yaml"
    assert data["config"]["rollout"]["concurrency"] == 5 and data["config"]["rollout"]["max_staleness"] == 1


def test_config_describe_lists_keys(cli):
    result, rows = cli.json("config", "show", "--describe")
    keys = {r["key"] for r in rows}
    assert "rollout.weight_sync_interval_steps" in keys and all(r["description"] for r in rows)


def test_runs_show_unknown_run_exits_2(cli):
    result = cli("runs", "show", "nope")
    assert result.exit_code == 2 and "no runs" in result.stderr or "no run" in result.stderr


def test_troubleshoot_english_and_chinese_reach_the_same_entry(cli):
    r_en, en = cli.json("troubleshoot", "GPU utilization low")
    r_zh, zh = cli.json("troubleshoot", "GPU 利用率低")
    assert r_en.exit_code == r_zh.exit_code == 0
    assert en["matches"][0]["id"] == zh["matches"][0]["id"] == "gpu-utilization-low"
    assert en["matches"][0]["causes"] and en["matches"][0]["actions"]


def test_troubleshoot_renders_causes_checks_and_actions(cli):
    result = cli("troubleshoot", "GPU 利用率低", "--lang", "zh")
    assert result.exit_code == 0
    assert "How to check" in result.stdout and "What to do" in result.stdout


def test_troubleshoot_unknown_symptom_lists_closest_and_exits_1(cli):
    result, data = cli.json("troubleshoot", "the espresso machine whistles")
    assert result.exit_code == 1 and not data["matched"] and len(data["closest"]) == 5
    text = cli("troubleshoot", "the espresso machine whistles")
    assert text.exit_code == 1 and "Closest symptoms" in text.stdout


def test_troubleshoot_list_and_usage_errors(cli):
    result, entries = cli.json("troubleshoot", "--list")
    assert result.exit_code == 0 and len(entries) >= 40
    assert cli("troubleshoot").exit_code == 2
    assert cli("troubleshoot", "x", "--lang", "fr").exit_code == 2
