"""`agentrl data query|metrics|gc|spool` and `agentrl replay` on a store the test fills with real
episodes (tool_api_like: no sandbox needed), as a user runs them."""

from __future__ import annotations

import datetime as dt

import pytest

from agentrl_cli.runtime.data.record_from_episode import record_from_episode
from agentrl_cli.runtime.data.local_store import LocalStore
from agentrl_cli.runtime.data.writer import TrajectoryWriter
from harnesses.contract import play
from harnesses.registry import resolve
from harnesses.tasks import TASK_SET_VERSION, load_tasks

pytestmark = pytest.mark.e2e


@pytest.fixture
def filled(tmp_path):
    root = tmp_path / "data"
    h = resolve("tool_api_like")()
    records = []
    try:
        for i, task in enumerate(load_tasks("tool_api_like", "eval")[:6]):
            policy = (lambda t, turn: None) if i == 5 else None  # one episode that never acts
            traj, _ = play(h, task, **({"policy": policy} if policy else {}))
            rec = record_from_episode(traj, run_id="run-a" if i < 4 else "run-b", harness_version=h.version,
                                      evidence=h.evidence(traj), task_set_version=TASK_SET_VERSION)
            if i == 4:
                rec.started_at = dt.datetime(2001, 1, 1, tzinfo=dt.timezone.utc)
            records.append(rec)
    finally:
        h.close()
    with TrajectoryWriter(LocalStore(root)) as w:
        for r in records:
            assert w.write(r)
    return ["--set", f"data.root={root}"], records


def test_query_filters_and_counts(cli, filled):
    sets, records = filled
    result, data = cli.json("data", "query", "turns >= 2", *sets)
    assert result.exit_code == 0
    assert data["matched"] == sum(r.turns >= 2 for r in records) == 5
    result, data = cli.json("data", "query", "", "--run", "run-b", *sets)
    assert data["matched"] == 2 and {row["trajectory_id"] for row in data["rows"]} == {r.trajectory_id for r in records[4:]}


def test_a_bad_filter_exits_2_and_lists_the_columns(cli, filled):
    sets, _ = filled
    result = cli("data", "query", "turnz > 1", *sets)
    assert result.exit_code == 2 and "turns" in result.stderr and "Traceback" not in result.stderr


def test_metrics_of_a_run_and_an_unknown_run(cli, filled):
    sets, records = filled
    result, data = cli.json("data", "metrics", "run-a", "--by", "harness", *sets)
    overall = next(r for r in data["rows"] if r["harness"] == "all")
    assert result.exit_code == 0 and overall["n"] == 4 and overall["mean_turns"] == sum(r.turns for r in records[:4]) / 4
    result = cli("data", "metrics", "run-zzz", *sets)
    assert result.exit_code == 2 and "run-zzz" in result.stderr


def test_gc_deletes_only_old_partitions(cli, filled):
    sets, records = filled
    result, dry = cli.json("data", "gc", "--older-than", "30d", "--dry-run", *sets)
    assert result.exit_code == 0 and len(dry["deleted"]) == 1 and "date=2001-01-01" in dry["deleted"][0]
    assert cli.json("data", "query", "", *sets)[1]["matched"] == 6  # dry run deleted nothing
    cli.json("data", "gc", "--older-than", "30d", *sets)
    assert cli.json("data", "query", "", *sets)[1]["matched"] == 5
    assert cli("data", "gc", "--older-than", "soon", *sets).exit_code == 2


def test_replay_by_id_reports_no_divergence_and_unknown_ids_exit_2(cli, filled):
    sets, records = filled
    result, data = cli.json("replay", records[0].trajectory_id, *sets)
    assert result.exit_code == 0 and data["ok"] and data["steps_compared"] == len(records[0].steps)
    result = cli("replay", "no-such-id", *sets)
    assert result.exit_code == 2 and "agentrl data query" in result.stderr


def test_spool_on_a_local_store_is_a_usage_error(cli, filled):
    sets, _ = filled
    result = cli("data", "spool", *sets)
    assert result.exit_code == 2 and "data.store: s3" in result.stderr
