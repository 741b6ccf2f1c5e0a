"""`agentrl verify` and `agentrl troubleshoot --run` as a user runs them: components down, usage
errors, the diagnosis of a healthy and a faulty run, and a whole verification on a random tiny model."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.unit.test_verify_faults import HEALTHY_EVALS, evals, loaded_config, make_run

pytestmark = pytest.mark.e2e


def test_verify_against_components_that_are_down_fails_connectivity_within_a_minute(tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTRL_")}
    cmd = [sys.executable, "-m", "agentrl_cli", "verify", "--json", "--set", f"inference.urls=[\"{dead}\"]",
           "--set", f"reward.service_url={dead}", "--set", f"sandbox.service_url={dead}",
           "--set", f"controlplane.state_store=postgresql://agentrl@127.0.0.1:{free_port()}/agentrl"]
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)  # the deadline
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Traceback" not in done.stderr + done.stdout
    data = json.loads(done.stdout)
    failed = {c["name"]: c for c in data["layers"]["connectivity"] if c["status"] == "fail"}
    for name in (f"inference server {dead}", f"reward service {dead}", f"sandboxes ({dead})"):
        assert name in failed and dead in failed[name]["detail"] and failed[name]["hint"], name
    assert any(n.startswith("state store") for n in failed)
    assert any("components are unreachable" in n for n in data["notes"])  # no verification run was started
    assert all(c["status"] != "fail" for k, v in data["layers"].items() if k != "connectivity" for c in v)
    assert Path(data["run_dir"], "reports", "verify.md").exists() or (tmp_path / data["run_dir"] / "reports" / "verify.md").exists()


def test_usage_errors_exit_2(cli):
    result = cli("verify", "--layer", "speed")
    assert result.exit_code == 2 and "connectivity" in result.stderr
    result = cli("troubleshoot", "loss nan", "--run", "latest")
    assert result.exit_code == 2 and "--run" in result.stderr
    result = cli("troubleshoot", "--run", "no-such-run")
    assert result.exit_code == 2 and "no run" in result.stderr


def test_help_shows_examples_of_every_mode(cli):
    text = cli("verify", "--help").stdout
    assert "Examples" in text and "--layer" in text and "--record-only" in text
    text = cli("troubleshoot", "--help").stdout
    assert "Examples" in text and "--run" in text


def test_troubleshoot_run_on_a_healthy_run_finds_nothing_and_on_a_faulty_one_ranks_it(cli, isolated):
    loaded = loaded_config(isolated)
    sets = ["--set", f"observe.runs_dir={isolated / 'runs'}", "--set", f"data.root={isolated / 'data'}"]
    healthy = make_run(loaded)
    result = cli("troubleshoot", "--run", healthy.run_id, *sets)
    assert result.exit_code == 0 and "no known problem found" in result.stdout
    faulty = make_run(loaded, eval_rows=evals(HEALTHY_EVALS[0], {"terminal_like": 0.6, "code_sandbox_like": 0.5, "tool_api_like": 0.0}))
    result, data = cli.json("troubleshoot", "--run", faulty.run_id, *sets)
    assert result.exit_code == 1 and data["findings"][0]["id"] == "held-out-harness-drop"
    assert data["findings"][0]["evidence"][0]["figures"]["drop"] == 0.55
    text = cli("troubleshoot", "--run", faulty.run_id, "--lang", "en", *sets).stdout
    assert "Held-out harness scores far below training harnesses" in text and "held-out tool_api_like 0.30 -> 0.00" in text
    assert "Adjust the harness mix" in text


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")
def test_verify_with_no_training_runs_its_own_verification_run_and_judges_every_layer(cli, isolated, random_model_dir):
    """A random tiny model on a small budget: the verification run, canaries, repeats and resume are
    real; a random model does not learn, so convergence is judged (and fails), never skipped."""
    sets = ["--set", f"model.path={random_model_dir}", "--set", f"inference.port={free_port()}",
            "--set", "stages.short_recipe=null", "--set", "verify.minutes=0.2", "--set", "verify.eval_tasks_per_family=1",
            "--set", "rollout.max_steps_per_trajectory=2", "--set", "inference.max_new_tokens=8", "--set", "rollout.group_size=2",
            "--set", "training.micro_batch_size=2", "--set", "rollout.mode=sync", "--set", "rollout.weight_sync_interval_steps=1",
            "--set", "rollout.eval_concurrency=1"]
    layers = ["--layer", "connectivity", "--layer", "correctness", "--layer", "convergence", "--layer", "cross_harness"]
    result, data = cli.json("verify", *layers, *sets)
    assert result.exit_code == (1 if data["status"] == "fail" else 0)
    assert any("verify trained" in n and "steps" in n for n in data["notes"]) and "verify's own verification run" in data["judged"]
    by = {c["name"]: c for checks in data["layers"].values() for c in checks}
    assert all(c["status"] == "pass" for c in data["layers"]["connectivity"] if not c["name"].startswith("state store")), \
        data["layers"]["connectivity"]
    for name in ("loss finite and of sane magnitude", "checkpoint written and complete",
                 "checkpoints of kept format versions load and train",
                 "checkpoint loads and training continues from it", "same tasks, same seed: same reward",
                 "canaries score 0: answers a cheating agent tries (scored now)", "canaries score 0: the policy's own attempts"):
        assert by[name]["status"] == "pass", (name, by[name])
    held = by["held-out harness tool_api_like vs training harnesses"]  # a random model may never solve it: then skipped
    assert held["status"] == "pass" or (held["status"] == "skip" and "scored 0 before and after" in held["detail"]), held
    progress = by["evaluation success rises (95% lower bound > 0)"]  # verify's run evaluates with episode counts
    assert progress["status"] in ("pass", "fail")
    assert len(progress["measured"]["evaluations"]) >= 2 and progress["measured"]["episodes"] >= 4
    run = Path(data["run_dir"])
    assert (run / "reports" / "verify.json").exists() and "## cross-harness" in (run / "reports" / "verify.md").read_text()
    [log] = (run / "verify" / "logs").glob("*-0.log")  # the resume probe's run took the verification run's server
    assert log.read_text().count("embedded inference server on") == 1 and not list((run / "verify" / "resume").rglob("*-0.log"))
    rows = [json.loads(line) for line in (run / "verify" / "metrics.jsonl").read_text().splitlines()]
    from agentrl_cli.acceptance.troubleshoot import signals

    emitted = {k for r in rows for k in r}
    # every signal the knowledge base may cite is in the run's rows; kl_ref needs training.kl_coef > 0,
    # creation failures, tool statuses and harness errors appear when they happen, and the gateway's
    # counters when the run trains an agent through the gateway (the `agent` harness; this run has none)
    occasional = {"train/kl_ref", "env/<harness>/create_failures/<error>", "env/<harness>/tool/<tool>/<status>",
                  "env/<harness>/harness_errors/<method>", "gateway/calls", "gateway/malformed_tool_calls",
                  "gateway/<harness>/malformed_tool_calls"}
    missing = [s for s in signals.METRICS - occasional
               if not any(re.fullmatch(re.sub(r"<\w+>", "[^/]+", s), k) for k in emitted)]
    assert not missing, missing
