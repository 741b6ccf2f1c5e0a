"""Tool calls as stored (schema 2) and the call log: names, arguments and outputs recorded from what
a step reports, the output clipped with its whole size and digest, version 1 files (a golden store
written by the version 1 writer) still read, the writer's call-log files beside the trajectories,
and `agentrl data calls` filtering them."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest

from agentrl_cli.runtime.data.calls import CALL_SCHEMA, calls_filter, read_calls
from agentrl_cli.runtime.data.local_store import LocalStore
from agentrl_cli.runtime.data.record_from_episode import clip_output, record_from_episode
from agentrl_cli.runtime.data.schema import SCHEMA_VERSION, StepRecord, ToolCallRecord, TrajectoryRecord
from agentrl_cli.runtime.data.writer import TrajectoryWriter, read_records
from agentrl_cli.core.episode import Action, Observation, TaskSpec, ToolCallResult, Trajectory
from agentrl_cli.model.chat import ChatRenderer
from harnesses.sandboxed import function_tool

GOLDEN_V1 = Path(__file__).resolve().parents[1] / "golden" / "trajectory_store_v1"
T0 = dt.datetime(2026, 12, 1, 10, tzinfo=dt.timezone.utc)


def test_clip_keeps_whole_characters_and_reports_the_whole_output():
    text = "é" * 10  # 2 bytes each
    clipped, size, digest = clip_output(text, 5)
    assert clipped == "éé" and size == 20 and digest == hashlib.sha256(text.encode()).hexdigest()
    assert clip_output("short", 100) == ("short", 5, hashlib.sha256(b"short").hexdigest())
    assert clip_output("abc", 0)[0] == ""


def _episode(text: str, results: list[ToolCallResult], observation: str = "shown") -> Trajectory:
    task = TaskSpec("t-1", "terminal_like", "do it", "3", 1, "train")
    return Trajectory(task=task, actions=[Action(text=text)],
                      observations=[Observation(text="do it"), Observation(text=observation, calls=results)])


def test_the_record_stores_each_reported_call_with_its_output_clipped():
    text = ('<tool_call>\n{"name": "run_shell", "arguments": {"command": "seq 1 500"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "run_shell", "arguments": {"command": "false"}}\n</tool_call>')
    long_output = "\n".join(str(i) for i in range(1, 501))
    # what the model emitted, read here from the text itself
    emitted = [json.loads(b) for b in re.findall(r"<tool_call>(.*?)</tool_call>", text, re.S)]
    results = [ToolCallResult(e["name"], e["arguments"], "ok", 12.0, exit_code=code, output=out)
               for e, code, out in zip(emitted, (0, 1), (long_output, ""))]
    record = record_from_episode(_episode(text, results), run_id="r", harness_version="1", max_output_bytes=64)
    calls = record.steps[0].tool_calls
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [(e["name"], e["arguments"]) for e in emitted]
    first, second = calls
    assert first.output == long_output.encode()[:64].decode() and first.output_bytes == len(long_output.encode())
    assert first.output_sha256 == hashlib.sha256(long_output.encode()).hexdigest() and first.exit_code == 0
    # an ok call whose command exited non-zero is an error; two calls: no observation text to give it
    assert (second.status, second.exit_code, second.output, second.output_bytes) == ("error", 1, "", 0)
    assert record.tool_failures == 1 and record.schema_version == SCHEMA_VERSION >= 2


def test_a_lone_call_reported_without_output_gets_the_step_observation():
    legacy = Observation(text="$ ls\na.txt\n[exit code 0]", info={"calls": [{"tool": "run_shell", "arguments": {"command": "ls"},
                                                                          "exit_code": 0, "duration_s": 0.5}]})
    task = TaskSpec("t-1", "legacy", "p", "", 1, "train")
    traj = Trajectory(task=task, actions=[Action(text="x")], observations=[Observation(text="p"), legacy])
    (call,) = record_from_episode(traj, run_id="r", harness_version="1").steps[0].tool_calls
    assert (call.name, call.arguments, call.exit_code, call.latency_ms) == ("run_shell", '{"command": "ls"}', 0, 500.0)
    assert call.output == legacy.text and call.output_bytes == len(legacy.text)


def test_the_chat_renderer_parses_calls_as_the_model_wrote_them(random_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(random_model_dir)
    text = ('Let me look.\n<tool_call>\n{"name": "lookup", "arguments": {"table": "prices", "key": "a b"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 ** 10"}}\n</tool_call>')
    tools = [function_tool("lookup", "", {"table": {"type": "string"}, "key": {"type": "string"}}, ["table", "key"]),
             function_tool("calculator", "", {"expression": {"type": "string"}}, ["expression"])]
    parsed = ChatRenderer(tok, "", tools).tool_calls(text)
    emitted = [json.loads(b) for b in re.findall(r"<tool_call>(.*?)</tool_call>", text, re.S)]
    assert [(c.name, c.arguments) for c in parsed] == [(e["name"], e["arguments"]) for e in emitted]


def test_version_1_files_still_read(tmp_path):
    store = LocalStore(tmp_path / "v1")
    shutil.copytree(GOLDEN_V1, store.root)
    records = {r.trajectory_id: r for r in read_records(store)}
    assert set(records) == {"golden-v1-train-g0-0", "golden-v1-train-g1-0"}
    term = records["golden-v1-train-g0-0"]
    assert term.schema_version == 1 and term.token_ids == [1, 2, 3] and term.final_answer == "3"
    (call,) = term.steps[0].tool_calls
    assert (call.name, call.arguments, call.status, call.latency_ms) == ("tool", "{}", "ok", 12.5)
    assert (call.exit_code, call.output, call.output_bytes, call.output_sha256) == (None, None, None, None)
    (api,) = records["golden-v1-train-g1-0"].steps[0].tool_calls
    assert (api.name, api.arguments, api.status, api.retries) == ("calculator", '{"expression": "1/0"}', "error", 1)
    # a version 2 file beside them: both read as one table
    with TrajectoryWriter(store) as w:
        assert w.write(_record("new", [_call("run_shell", "ls", "a.txt")]))
    assert {r.schema_version for r in read_records(store)} == {1, SCHEMA_VERSION}
    # schema 3's role columns: null in the older files (single-agent episodes)
    assert term.role is None and term.steps[0].role is None


def _call(tool: str, command: str, output: str, status: str = "ok") -> ToolCallRecord:
    clipped, size, digest = clip_output(output, 1024)
    return ToolCallRecord(tool, json.dumps({"command": command}), status, 3.0, 0, 0 if status == "ok" else 2,
                          clipped, size, digest)


def _record(tid: str, calls: list[ToolCallRecord], task: str = "task-a", harness: str = "terminal_like",
            run: str = "run-1") -> TrajectoryRecord:
    return TrajectoryRecord(run_id=run, task_id=task, harness=harness, harness_version="1", trajectory_id=tid,
                            steps=[StepRecord(i, "act", "obs", tool_calls=[c], started_at=T0, ended_at=T0)
                                   for i, c in enumerate(calls)], started_at=T0, ended_at=T0)


@pytest.fixture
def store(tmp_path) -> LocalStore:
    store = LocalStore(tmp_path / "store")
    with TrajectoryWriter(store, rows_per_file=2, call_log=True) as w:
        w.write(_record("t1", [_call("run_shell", "ls", "a.txt"), _call("run_shell", "cat x", "no such file", "error")]))
        w.write(_record("t2", [_call("run_python", "print(1)", "1")], task="task-b", harness="code_sandbox_like"))
        w.write(_record("t3", [_call("calculator", "1+1", "2")], task="task-b", harness="tool_api_like", run="run-2"))
        w.write(_record("t4", []))  # no calls: nothing in the log
    assert w.stats["calls_logged"] == 4
    return store


def test_the_writer_logs_calls_beside_the_trajectories(store):
    keys = [i.key for i in store.list()]
    call_keys = [k for k in keys if k.startswith("calls/")]
    assert sorted(k.split("/")[1] for k in call_keys) == ["harness=code_sandbox_like", "harness=terminal_like",
                                                          "harness=tool_api_like"]
    assert all(k.split("/")[2] == "date=2026-12-01" for k in call_keys)
    assert len(read_records(store)) == 4  # the trajectory table ignores the call log
    table = read_calls(store)
    assert table.schema.names == CALL_SCHEMA.names and table.num_rows == 4
    row = read_calls(store, calls_filter(trajectory="t1", status="error")).to_pylist()
    assert [(r["step"], r["call"], r["tool"], json.loads(r["arguments"]), r["exit_code"], r["output"], r["harness"])
            for r in row] == [(1, 0, "run_shell", {"command": "cat x"}, 2, "no such file", "terminal_like")]
    assert row[0]["output_sha256"] == hashlib.sha256(b"no such file").hexdigest()


@pytest.mark.parametrize("options, expected", [
    (["--task", "task-b"], ["t2", "t3"]),
    (["--task", "task-a", "--status", "error"], ["t1"]),
    (["--tool", "run_python"], ["t2"]),
    (["--run", "run-2"], ["t3"]),
    (["--trajectory", "t1"], ["t1", "t1"]),
    (["--task", "nothing"], []),
])
def test_data_calls_filters(cli, store, options, expected):
    result, data = cli.json("data", "calls", *options, "--set", f"data.root={store.root}")
    assert result.exit_code == 0, result.output
    assert sorted(r["trajectory_id"] for r in data["rows"]) == expected and data["matched"] == len(expected)


def test_data_calls_prints_a_table(cli, store):
    result = cli("data", "calls", "--task", "task-a", "--set", f"data.root={store.root}")
    assert result.exit_code == 0 and all(w in result.stdout for w in ("run_shell", "error", "a.txt"))


def test_a_call_log_file_that_fails_is_retried_and_not_lost(tmp_path, monkeypatch):
    import agentrl_cli.runtime.data.writer as writer_mod

    store = LocalStore(tmp_path / "store")
    real = writer_mod.publish_calls
    failing = {"left": 1}

    def flaky(*args, **kwargs):
        if failing["left"]:
            failing["left"] -= 1
            raise OSError("disk said no")
        return real(*args, **kwargs)
    monkeypatch.setattr(writer_mod, "publish_calls", flaky)
    w = TrajectoryWriter(store, rows_per_file=1, call_log=True)
    w.write(_record("t1", [_call("run_shell", "ls", "a.txt")]))  # fills the file: published, its calls wait
    assert len(read_records(store)) == 1 and read_calls(store).num_rows == 0
    w.flush()
    assert read_calls(store).column("trajectory_id").to_pylist() == ["t1"] and len(read_records(store)) == 1


def test_data_calls_refuses_an_unknown_status(cli, store):
    result = cli("data", "calls", "--status", "failed", "--set", f"data.root={store.root}")
    assert result.exit_code == 2 and "'failed' is not a call status" in result.output and "timeout" in result.output


def test_a_step_stores_the_reward_its_harness_reported_unless_one_was_given():
    traj = Trajectory(task=TaskSpec("t-2", "openenv", "p", "", 1, "train"), observations=[Observation(text="start")])
    for text, info in (("a", {"reward": 0.25}), ("b", {"reward": None}), ("c", {"reward": True}), ("d", {}),
                       ("e", {"reward": 1})):
        traj.actions.append(Action(text=text))
        traj.observations.append(Observation(text="o", info=info))
    rewards = [s.reward for s in record_from_episode(traj, run_id="r", harness_version="1").steps]
    assert rewards == [0.25, 0.0, 0.0, 0.0, 1.0]  # numbers only: None, a flag or nothing store 0.0
    given = record_from_episode(traj, run_id="r", harness_version="1", step_rewards=[None, 0.5, None, None, -1.0]).steps
    assert [s.reward for s in given] == [0.25, 0.5, 0.0, 0.0, -1.0]  # a reward given to the step wins
