"""`agentrl stage run 0` and `agentrl stage run 8` on a random tiny model, as a user runs them: the
whole loop once with baseline.json, and a phase that does not exist refused. (Stage 8 smoke's
checkpoint, resume and unique ids are checked in `stage run all`, tests/e2e/test_installed_cli.py.)"""

from __future__ import annotations

import json
import shutil

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.integration,
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")]


def test_stage_0_runs_the_loop_once_and_writes_the_baseline(cli, quick_sets, isolated):
    result, data = cli.json("stage", "run", "0", *quick_sets)
    report = data["reports"][0]
    failing = [(c["name"], c["detail"][-400:]) for c in report["checks"] if c["status"] != "pass"]
    assert result.exit_code == 0 and report["status"] == "pass", failing
    [run] = [p for p in (isolated / "runs").iterdir() if (p / "meta.json").exists()]
    baseline = json.loads((run / "baseline.json").read_text())
    assert baseline["steps"] == 2 and baseline["tokens_generated"] > 0 and baseline["env_step_latency_s"] > 0
    assert abs(sum(baseline["time_shares"].values()) - 1) < 1e-6
    # what verify compares later runs with: throughput and per-stream rate, samples/min, server load
    assert baseline["tokens_per_s"] > 0 and baseline["tokens_per_s_per_stream"] > 0 and baseline["samples_per_min"] > 0
    assert 0 < baseline["server_busy_fraction"] <= 1 and baseline["inference_queue_len_mean"] is not None
    assert 0 <= baseline["env_failure_rate"] <= 1 and 0 < baseline["timed_fraction"] <= 1
    by_name = {c["name"]: c for c in report["checks"]}
    assert by_name["phase timers cover the loop"]["status"] == "pass"
    assert by_name["time shares (sampling / training / sync)"]["status"] == "info"
    assert by_name["tokens/s: throughput and per stream"]["status"] == "info"
    assert report["counts"]["info"] == 3
    assert by_name["where the time goes (s per step; lower bound and ratio beside each phase)"]["status"] == "info"
    assert_phases_add_up(baseline["phases"], baseline["tokens_generated"])


def assert_phases_add_up(phases: dict, tokens_generated: int) -> None:
    """Where the time goes: every phase of each step present; those on the trainer's path add up to
    the step's wall time (`other` being what no timer covers); the server's idle and busy time fill
    its window; prefill + decode tokens are what the server computed and generated."""
    from agentrl_cli.acceptance.phases import BESIDE, PATH

    assert len(phases["steps"]) == 2 and phases["rates"]["gemm_gflops"] > 0
    for step in phases["steps"]:
        assert set(step["path"]) == set(PATH) and set(step["beside"]) == set(BESIDE)
        assert abs(sum(p["s"] for p in step["path"].values()) - step["step_s"]) < 0.002 * len(PATH)
        assert step["path"]["forward"]["s"] > 0 and step["path"]["backward"]["s"] > 0 and step["path"]["optimizer"]["s"] > 0
        for name in ("forward", "backward", "prefill", "decode"):
            part = step["path"].get(name) or step["beside"][name]
            assert part["bound_s"] > 0 and abs(part["ratio"] - part["s"] / part["bound_s"]) <= 0.02 * part["ratio"] + 0.01
        decode = step["beside"]["decode"]
        assert 1 <= decode["occupancy"] <= decode["max_batch_size"]
        server = [step["beside"][n]["s"] for n in ("prefill", "decode", "server_rest", "server_idle")]
        assert abs(sum(server) - step["beside"]["server_idle"]["window_s"]) < 0.01 or step["beside"]["server_idle"]["s"] == 0
    assert sum(s["tokens"]["decode"] for s in phases["steps"]) >= tokens_generated  # and the health checks' tokens


def test_stage_8_rejects_an_unknown_phase(cli, quick_sets):
    result = cli("stage", "run", "8", "--phase", "huge", *quick_sets)
    assert result.exit_code == 2 and "phase" in result.stderr
