"""A short real run (random tiny model, embedded server, DeepSpeed on gloo, two GRPO steps) in a run
directory with meta.json, with `observe.trackers: [tensorboard, wandb, mlflow]` and `observe.traces`
on. Each store is read back with its own library: TensorBoard's EventAccumulator, W&B's `wandb leet
inspect --json` over the offline run, MLflow's MlflowClient over the sqlite store; they hold the
metric names and steps of metrics.jsonl, the masked config and the run's metadata, and no secret. The
OTLP JSON trace file holds one tree per episode, its root carrying the stored trajectory's id. The
run's observe.log_level (warning) reaches the inference server it starts."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl_cli.config import load_config
from agentrl_cli.runtime.data.local_store import LocalStore
from agentrl_cli.runtime.data.writer import read_records
from agentrl_cli.runtime.observe.step_metrics import read_rows
from agentrl_cli.runtime.observe.trackers import scalars
from agentrl_cli.acceptance.run_meta import create_run
from agentrl_cli.run.training_run import train
from tests.conftest import free_port
from tests.integration.conftest import needs_bwrap

pytestmark = [pytest.mark.integration, needs_bwrap]
SECRET = "sk-tracked-run-secret-0123456789"  # inference.api_key: must reach no tracker
WANDB = str(Path(sys.executable).with_name("wandb"))


@pytest.fixture(scope="module")
def tracked(tmp_path_factory, random_model_dir):
    work = tmp_path_factory.mktemp("tracked")
    sets = {"inference.port": free_port(), "inference.max_new_tokens": 16, "rollout.concurrency": 4,
            "rollout.group_size": 2, "rollout.max_steps_per_trajectory": 2, "rollout.mode": "sync",
            "training.micro_batch_size": 4, "training.checkpoint_interval_steps": 100, "data.root": str(work / "store"),
            "model.path": str(random_model_dir), "observe.runs_dir": str(work / "runs"),
            "observe.trackers": "[tensorboard, wandb, mlflow]", "observe.traces": str(work / "traces.jsonl"),
            "inference.api_key": SECRET, "harnesses": '[{"name": "tool_api_like"}]', "observe.log_level": "warning"}
    with pytest.MonkeyPatch.context() as mp:
        for key in [k for k in os.environ if k.startswith(("WANDB_", "MLFLOW_", "AGENTRL_"))]:
            mp.delenv(key)
        for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):  # never the user's home
            mp.setenv(var, str(work / "wandb-home"))
        loaded = load_config(None, [f"{k}={v}" for k, v in sets.items()], env={})
        run = create_run(loaded, run_id="tracked", command=["pytest", "test_trackers"])
        summary = asyncio.run(train(loaded.config, run.path / "stage8", random_model_dir, 2, run_id="tracked"))
    assert summary.steps == 2
    return {"work": work, "run": run.path, "log": run.path / "stage8", "cfg": loaded.config}


def expected_series(log_dir: Path) -> dict[str, set[int]]:
    """What metrics.jsonl holds, as tracker names -> steps."""
    series: dict[str, set[int]] = {}
    for row in read_rows(log_dir / "metrics.jsonl"):
        step, values = scalars(row)
        for key in values:
            series.setdefault(key, set()).add(step)
    return series


def tensorboard_series(log_dir: Path) -> dict[str, set[int]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    series: dict[str, set[int]] = {}
    for f in sorted((log_dir / "tensorboard").glob("events.out.tfevents.*")):
        acc = EventAccumulator(str(f))
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            series.setdefault(tag, set()).update(e.step for e in acc.Scalars(tag))
    return series


def wandb_records(run_dir: Path) -> list[dict]:
    [offline] = sorted((run_dir / "wandb").glob("offline-run-*"))
    proc = subprocess.run([WANDB, "leet", "inspect", "--json", str(offline)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def wandb_series(records: list[dict]) -> dict[str, set[int]]:
    series: dict[str, set[int]] = {}
    for rec in records:
        if rec["type"] == "history":
            step = int(rec["history"]["step"]["num"]) if rec["history"].get("step") else 0
            for key in rec["history"]["item"]:
                if not key.startswith("_"):
                    series.setdefault(key, set()).add(step)
    return series


def mlflow_run(work: Path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{work / 'runs' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("agentrl")
    [found] = client.search_runs([experiment.experiment_id])
    return client, found


def test_wandb_and_mlflow_hold_the_metric_names_and_steps_of_tensorboard_and_metrics_jsonl(tracked):
    expected = expected_series(tracked["log"])
    assert {"train/loss", "reward/mean", "time/train_s", "rollout/tokens_generated"} <= set(expected)
    assert expected["train/loss"] == {1, 2}
    assert tensorboard_series(tracked["log"]) == expected
    assert wandb_series(wandb_records(tracked["run"])) == expected
    client, run = mlflow_run(tracked["work"])
    got = {key: {m.step for m in client.get_metric_history(run.info.run_id, key)} for key in run.data.metrics}
    assert got == expected
    assert run.info.status == "FINISHED" and run.info.run_name == "tracked/stage8"


def test_the_trackers_record_the_masked_config_and_the_run_metadata(tracked, tmp_path):
    client, run = mlflow_run(tracked["work"])
    params, tags = run.data.params, run.data.tags
    assert params["rollout.group_size"] == "2" and params["observe.trackers"] == json.dumps(["tensorboard", "wandb", "mlflow"])
    assert tags["agentrl.run_id"] == "tracked" and tags["agentrl.config_hash"]
    config = json.loads(Path(client.download_artifacts(run.info.run_id, "config.json", str(tmp_path))).read_text())
    meta = json.loads(Path(client.download_artifacts(run.info.run_id, "meta.json", str(tmp_path))).read_text())
    assert config["rollout"]["group_size"] == 2 and meta["run_id"] == "tracked" and "packages" in meta
    assert SECRET not in json.dumps(params) + json.dumps(config) + json.dumps(meta)

    records = wandb_records(tracked["run"])
    [started] = [r["run"] for r in records if r["type"] == "run"]
    wandb_config = json.dumps(started["config"])
    assert '"group_size"' in wandb_config and '"run_meta"' in wandb_config and '"config_hash"' in wandb_config
    assert started["display_name"] == "tracked/stage8" and started["project"] == "agentrl"
    assert SECRET not in json.dumps(records)

    events = b"".join(f.read_bytes() for f in (tracked["log"] / "tensorboard").glob("events.out.tfevents.*"))
    assert b"group_size" in events and SECRET.encode() not in events


def spans(path: Path) -> list[dict]:
    """Every span of an OTLP JSON lines file, with its attributes as a dict."""
    out = []
    for line in path.read_text().splitlines():
        for resource in json.loads(line)["resourceSpans"]:
            for scope in resource["scopeSpans"]:
                for span in scope["spans"]:
                    attrs = {a["key"]: next(iter(a["value"].values())) for a in span.get("attributes", [])}
                    out.append({**span, "attrs": attrs})
    return out


def test_the_trace_file_holds_one_tree_per_episode_rooted_at_its_trajectory(tracked):
    found = spans(tracked["work"] / "traces.jsonl")
    by_id = {s["spanId"]: s for s in found}
    roots = [s for s in found if not s.get("parentSpanId")]
    episodes = [s for s in roots if s["name"] == "episode"]
    steps = [s for s in roots if s["name"] == "train_step"]
    assert sorted(s["attrs"]["agentrl.step"] for s in steps) == ["1", "2"]  # OTLP JSON: int64 as a string
    assert len({s["traceId"] for s in roots}) == len(roots)  # one root per trace
    stored = {r.trajectory_id for r in read_records(LocalStore(tracked["work"] / "store"))}
    assert {s["attrs"]["agentrl.trajectory_id"] for s in episodes} == stored and len(episodes) == len(stored)
    for root in episodes:
        assert root["attrs"]["agentrl.harness"] == "tool_api_like" and root["attrs"]["agentrl.run_id"] == "tracked"
        assert root["attrs"]["agentrl.phase"] == "train"
        assert root["attrs"]["agentrl.task_id"] and root["attrs"]["agentrl.termination"]
        children = [s for s in found if s.get("parentSpanId") == root["spanId"]]
        assert all(c["traceId"] == root["traceId"] for c in children)
        kinds = [c["name"] for c in children]
        assert set(kinds) <= {"model_call", "tool_call", "reward"}, kinds
        assert kinds.count("reward") == 1 and kinds.count("model_call") >= 1
        assert kinds.count("tool_call") in (kinds.count("model_call"), kinds.count("model_call") - 1)
    for span in found:  # every child hangs off a span of the file, in its trace
        if span.get("parentSpanId"):
            assert by_id[span["parentSpanId"]]["traceId"] == span["traceId"]


def test_the_run_s_log_level_reaches_the_inference_server_it_starts(tracked):
    server_log = (tracked["log"] / "logs" / "hf-0.log").read_text()
    assert "embedded inference server on" in server_log  # printed, not logged
    assert "INFO:" not in server_log  # uvicorn's access and start-up lines are INFO: off at warning
    assert (tracked["log"] / "logs" / "agentrl.log").exists()
