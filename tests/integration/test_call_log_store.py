"""The call log in both stores (a local directory and S3, moto's server on 127.0.0.1): the rollout's
writer (`open_writer`) publishes it beside the trajectories, secrets in outputs and arguments are
redacted before a byte is written, `agentrl data calls` reads it with its filters, and with S3 a
call-log file is spooled with its trajectory file while the store is unreachable."""

from __future__ import annotations

import datetime as dt

import pytest

from agentrl_cli.config.models import DataConfig, S3Config
from agentrl_cli.runtime.data.calls import calls_filter, read_calls
from agentrl_cli.runtime.data.schema import StepRecord, ToolCallRecord, TrajectoryRecord
from agentrl_cli.runtime.data.writer import open_writer, read_records

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("aws_env")]
T0 = dt.datetime(2026, 12, 2, 8, tzinfo=dt.timezone.utc)
GH_TOKEN = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"




def _record(tid: str, task: str, calls: list[ToolCallRecord]) -> TrajectoryRecord:
    return TrajectoryRecord(run_id="run-s", task_id=task, harness="terminal_like", harness_version="1", trajectory_id=tid,
                            steps=[StepRecord(0, "act", "obs", tool_calls=calls, started_at=T0, ended_at=T0)],
                            started_at=T0, ended_at=T0)


def test_the_call_log_in_either_store(data_config, cli, tmp_path):
    writer = open_writer(data_config)
    leaked = f"export GITHUB_TOKEN={GH_TOKEN}"
    writer.write(_record("a", "task-1", [ToolCallRecord("run_shell", '{"command": "env"}', "ok", 2.0, 0, 0, leaked, 64, "0" * 64)]))
    writer.write(_record("b", "task-2", [ToolCallRecord("run_shell", '{"command": "false"}', "error", 1.0, 0, 1, "", 0, "e3b0")]))
    writer.close()
    assert len(read_records(writer.store)) == 2 and writer.stats["calls_logged"] == 2
    (row,) = read_calls(writer.store, calls_filter(task="task-1")).to_pylist()
    assert GH_TOKEN not in row["output"] and "[REDACTED" in row["output"] and row["output_sha256"] == "0" * 64
    assert (row["trajectory_id"], row["harness"], row["date"]) == ("a", "terminal_like", "2026-12-02")
    sets = [f"data.root={data_config.root}", f"data.store={data_config.store}"]
    if data_config.store == "s3":
        sets += [f"data.s3.bucket={data_config.s3.bucket}", f"data.s3.endpoint_url={data_config.s3.endpoint_url}"]
    args = [a for s in sets for a in ("--set", s)]
    result, data = cli.json("data", "calls", "--status", "error", *args)
    assert result.exit_code == 0, result.output
    assert [(r["trajectory_id"], r["exit_code"]) for r in data["rows"]] == [("b", 1)]


def test_an_unreachable_s3_spools_the_call_log_with_the_trajectories(tmp_path):
    unreachable = DataConfig(store="s3", root=str(tmp_path / "data"),
                             s3=S3Config(bucket="nowhere", prefix="t", endpoint_url="http://127.0.0.1:9"))
    writer = open_writer(unreachable)
    writer.store.attempts = 1
    writer.write(_record("a", "task-1", [ToolCallRecord("run_shell", '{"command": "ls"}', "ok", 1.0, 0, 0, "x", 1, "2d71")]))
    writer.close()
    assert writer.stats["spooled"] == 1 and writer.store.spooled() == 2  # the trajectory file and its call log
    assert read_calls(writer.store.spool, calls_filter(trajectory="a")).column("tool").to_pylist() == ["run_shell"]


def test_version_1_files_read_from_either_store(data_config):
    """The golden store the version 1 writer wrote, published file by file into the store."""
    from pathlib import Path

    from agentrl_cli.runtime.data.stores import open_store

    golden = Path(__file__).resolve().parents[1] / "golden" / "trajectory_store_v1"
    store = open_store(data_config)
    for path in sorted(golden.rglob("*.parquet")):
        store.staging_dir.mkdir(parents=True, exist_ok=True)
        staged = store.staging_dir / path.name
        staged.write_bytes(path.read_bytes())
        store.publish(staged, path.relative_to(golden).as_posix())
    records = sorted(read_records(store), key=lambda r: r.trajectory_id)
    assert [(r.trajectory_id, r.schema_version) for r in records] == [("golden-v1-train-g0-0", 1), ("golden-v1-train-g1-0", 1)]
    calls = [c for r in records for s in r.steps for c in s.tool_calls]
    assert [(c.name, c.status, c.output, c.exit_code) for c in calls] == [("tool", "ok", None, None),
                                                                          ("calculator", "error", None, None)]
