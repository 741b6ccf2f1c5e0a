"""Stage 1's measuring code without ranks: sizes, the nccl-tests bus factor, how a hang is judged,
and the storage probe on this machine's disk (real files, small sizes)."""

from __future__ import annotations


import pytest

from agentrl_cli.bench import allreduce as ar
from agentrl_cli.bench import storage


def test_sizes_parse_with_binary_suffixes_and_bad_ones_are_named():
    assert [ar.parse_size(s) for s in ("4096", "64K", "4M", "1g", "2MiB")] == [4096, 65536, 4 << 20, 1 << 30, 2 << 20]
    with pytest.raises(ValueError, match="'lots'"):
        ar.parse_size("lots")
    with pytest.raises(ValueError, match="below one float32"):
        ar.parse_size("2")
    assert ar.sizes_up_to(4 << 20) == (4096, 65536, 1 << 20, 4 << 20)
    assert ar.sizes_up_to(100_000) == (4096, 65536, 100_000)


def test_bus_factor_is_the_nccl_tests_convention():
    assert ar.bus_factor(2) == 1.0
    assert ar.bus_factor(8) == pytest.approx(1.75)
    assert ar.bus_factor(1) == 0.0


def test_a_hang_is_one_failing_check_naming_the_missing_rank():
    result = ar.AllreduceResult(ok=False, world_size=4, backend="gloo", timed_out=True, elapsed_s=20.0,
                                missing_ranks=[3], stuck={0: "joined"}, error="never joined: rank 3")
    checks = ar.checks(result, 0.05)
    assert [c.status for c in checks] == ["fail"]
    assert checks[0].measured["missing_ranks"] == [3] and "rank 3" in checks[0].detail and checks[0].hint


def test_one_rank_cannot_judge_bus_bandwidth():
    row = {"bytes": 4096, "count": 1024, "iters": 5, "time_us": 10.0, "algbw_gbps": 0.4, "busbw_gbps": 0.0, "correct": True}
    checks = ar.checks(ar.AllreduceResult(ok=True, world_size=1, backend="gloo", rows=[row]), 0.05)
    assert [c.status for c in checks] == ["pass", "pass", "skip"]


def test_bandwidth_below_the_threshold_fails_with_a_hint():
    row = {"bytes": 4 << 20, "count": 1 << 20, "iters": 5, "time_us": 1e5, "algbw_gbps": 0.04, "busbw_gbps": 0.04, "correct": True}
    bw = ar.checks(ar.AllreduceResult(ok=True, world_size=2, backend="gloo", rows=[row]), 0.05)[-1]
    assert bw.name == "all-reduce bus bandwidth" and bw.status == "fail" and "allreduce_min_gbps" in bw.hint


def test_stage_spec_follows_the_config():
    from agentrl_cli.config import load_config

    cfg = load_config(None, ["stages.allreduce_max_mb=1", "stages.allreduce_timeout_s=30"]).config
    spec = ar.spec_from_config(cfg)
    assert (spec.ranks, spec.backend, spec.sizes, spec.deadline_s) == (2, "gloo", (4096, 65536, 1 << 20), 30.0)
    gpu = ar.spec_from_config(load_config(None, ["cluster.gpus_per_node=8"]).config)
    assert (gpu.ranks, gpu.backend) == (8, "nccl")


def test_storage_probe_measures_and_cleans_up(tmp_path):
    res = storage.measure_storage(tmp_path, size_mb=4, files=50)
    assert res.error == "" and res.write_mbps > 0 and res.small_files_per_s > 0 and res.free_bytes > 0
    assert list(tmp_path.iterdir()) == []
    checks = storage.checks(res, 0.0, 0.0, need_bytes=1, need_detail="1 byte")
    assert [c.status for c in checks] == ["pass", "pass", "pass"]


def test_unwritable_checkpoint_dir_is_a_failing_check_with_a_hint(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    res = storage.measure_storage(blocker / "checkpoints", size_mb=1, files=10)
    checks = storage.checks(res, 50, 200)
    assert len(checks) == 1 and checks[0].status == "fail" and "Not a directory" in checks[0].detail
    assert "observe.runs_dir" in checks[0].hint


def test_too_little_free_space_fails(tmp_path):
    res = storage.measure_storage(tmp_path, size_mb=1, files=10)
    free = [c for c in storage.checks(res, 0, 0, need_bytes=res.free_bytes * 10, need_detail="a lot")
            if c.name == "free space for checkpoints"][0]
    assert free.status == "fail" and free.hint


def test_checkpoint_bytes_formula():
    assert storage.checkpoint_bytes(1000, "fp32") == 1000 * 12
    assert storage.checkpoint_bytes(1000, "bf16") == 1000 * 14
