"""`agentrl stage run 1` as a user runs it, and `agentrl bench` on good and bad input."""

from __future__ import annotations

import json
import shutil

import pytest

from agentrl_cli.ops.bench.allreduce import bus_factor
from tests.conftest import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.integration,
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")]
STAGE1 = {"all-reduce completes", "all-reduce sums correct", "all-reduce bus bandwidth", "checkpoint write bandwidth",
          "small-file create rate", "free space for checkpoints", "object store reachable", "object store put",
          "object store list", "object store get", "object store create-only put", "object store delete",
          "sandbox network isolated", "sandbox egress allowlist"}


def test_stage_1_passes_here_and_skips_only_nccl(cli, isolated):
    result, data = cli.json("stage", "run", "1", "--set", "stages.allreduce_max_mb=1", "--set", "stages.storage_probe_mb=16")
    report = data["reports"][0]
    by_name = {c["name"]: c for c in report["checks"]}
    assert result.exit_code == 0 and report["status"] == "pass", [(c["name"], c["detail"][:200]) for c in report["checks"]
                                                                   if c["status"] != "pass"]
    assert STAGE1 <= {n for n, c in by_name.items() if c["status"] == "pass"}
    assert [n for n, c in by_name.items() if c["status"] == "skip"] == ["all-reduce over NCCL"]
    assert "GPU" in by_name["all-reduce over NCCL"]["detail"]
    rows = by_name["all-reduce bus bandwidth"]["measured"]
    assert [r["bytes"] for r in rows] == [4096, 65536, 1 << 20] and all(r["busbw_gbps"] > 0 for r in rows)
    meta = json.loads((isolated / "runs" / data["run_id"] / "meta.json").read_text())
    assert meta["image_lock"]["digest"] and meta["image_lock"]["pinned"] is False


def test_bench_allreduce_json_reports_nccl_tests_figures(cli):
    result, data = cli.json("bench", "allreduce", "--sizes", "4K,1M", "--iters", "5")
    assert result.exit_code == 0 and data["status"] == "pass"
    rows = data["result"]["rows"]
    assert [r["bytes"] for r in rows] == [4096, 1 << 20] and data["result"]["world_size"] == 2
    for row in rows:  # algbw = bytes / time; busbw = algbw * 2(n-1)/n, which is 1 for two ranks
        assert row["correct"] and row["busbw_gbps"] > 0
        assert row["algbw_gbps"] == pytest.approx(row["bytes"] / (row["time_us"] / 1e6) / 1e9, rel=1e-2, abs=1e-4)
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * bus_factor(2), rel=1e-3, abs=1e-4)


def test_bench_storage_on_an_unwritable_dir_fails_with_a_hint(cli, tmp_path):
    (tmp_path / "a-file").write_text("x")
    result, data = cli.json("bench", "storage", "--dir", str(tmp_path / "a-file" / "ckpt"), "--size-mb", "1", "--files", "10")
    assert result.exit_code == 1 and data["status"] == "fail"
    (check,) = data["checks"]
    assert check["name"] == "checkpoint dir writable" and check["hint"] and "Traceback" not in result.output


def test_bench_storage_measures_a_writable_dir(cli, tmp_path):
    result, data = cli.json("bench", "storage", "--dir", str(tmp_path), "--size-mb", "4", "--files", "50",
                            "--set", "stages.checkpoint_write_min_mbps=0", "--set", "stages.small_files_min_per_s=0")
    assert result.exit_code == 0 and data["result"]["write_mbps"] > 0 and data["result"]["small_files_per_s"] > 0


def test_bench_store_unreachable_fails_with_a_hint(cli, aws_env, tmp_path):
    result, data = cli.json("bench", "store", "--set", "data.store=s3", "--set", f"data.s3.endpoint_url=http://127.0.0.1:{free_port()}",
                            "--set", f"data.root={tmp_path}")
    assert result.exit_code == 1 and data["checks"][0]["status"] == "fail" and data["checks"][0]["hint"]
    assert "Traceback" not in result.output


def test_bench_bad_usage_exits_2(cli):
    assert cli("bench", "allreduce", "--sizes", "lots").exit_code == 2
    assert cli("bench", "allreduce", "--nnodes", "2").exit_code == 2  # no --master-port


@pytest.mark.parametrize("args", [["bench", "allreduce"], ["bench", "storage"], ["bench", "store"], ["image", "lock"],
                                  ["image", "render"], ["image", "verify"], ["image", "build"], ["plan"]])
def test_help_shows_examples_and_json(cli, args):
    result = cli(*args, "--help")
    assert result.exit_code == 0 and "Examples" in result.stdout and "--json" in result.stdout
