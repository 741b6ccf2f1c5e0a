"""`agentrl eval` on a real model through the real rollout side (an embedded inference server on
127.0.0.1, the tool_api_like harness, the reward, the trajectory store): the totals and pass@k it
reports agree with its results and the store; an evaluation SIGKILLed halfway and resumed plays only
what was missing and ends with the same totals, and the same trajectories, as an uninterrupted one.

What is compared after the resume: every total (greedy success, pass@k, episodes, errors per
harness and family) and, episode by episode, outcome, reward and the generated token ids. They
must be equal because greedy decoding is deterministic and every sampled episode has a seed of its
own, with one episode at a time (`rollout.eval_concurrency=1`: no batch make-up to differ) and no
prefix cache (`inference.prefix_cache_tokens=0`: the same computation whatever ran before).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from math import comb
from pathlib import Path

import pytest

from agentrl_cli.runtime.data.local_store import LocalStore
from agentrl_cli.runtime.data.writer import read_records
from tests.conftest import free_port

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PLAN = ["--harness", "tool_api_like", "--limit", "2", "-k", "1,2"]  # 2 families x 2 tasks x (greedy + 2 samples)
EPISODES = 12


def sets(port: int) -> list[str]:
    pairs = {"inference.port": port, "inference.max_new_tokens": 8, "inference.prefix_cache_tokens": 0,
             "rollout.max_steps_per_trajectory": 2, "rollout.eval_concurrency": 1}
    return [a for k, v in pairs.items() for a in ("--set", f"{k}={v}")]


def results(eval_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (eval_dir / "results.jsonl").read_text().splitlines()]


def stored(run_id: str) -> dict:
    """The store's trajectories of one evaluation, by trajectory id."""
    return {r.trajectory_id: r for r in read_records(LocalStore(Path("data/trajectories"))) if r.run_id == run_id}


def episode(trajectory_id: str) -> str:
    """The planned episode a trajectory id plays, whichever attempt played it: t00003-2."""
    return re.sub(r"r\d+-(\d+)$", r"-\1", trajectory_id).rsplit("-eval-", 1)[1]


def wait_for_lines(path: Path, n: int, proc: subprocess.Popen, seconds: float) -> int:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        lines = path.read_bytes().count(b"\n") if path.exists() else 0
        if lines >= n or proc.poll() is not None:
            return lines
        time.sleep(0.005)
    return path.read_bytes().count(b"\n") if path.exists() else 0


def port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_eval_totals_store_and_a_killed_evaluation_resumed(cli, random_model_dir, tmp_path):
    # an uninterrupted evaluation
    whole, body = cli.json("eval", str(random_model_dir), *PLAN, *sets(free_port()))
    assert whole.exit_code == 0, whole.stderr
    assert body["complete"] and body["episodes_planned"] == body["played_now"] == EPISODES and body["samples"] == 2
    h = body["harnesses"]["tool_api_like"]
    assert h["held_out"] and h["tasks"] == 4 and (h["episodes"], h["errors"], h["missing"]) == (EPISODES, 0, 0)
    assert set(h["families"]) == {"arith", "lookup_sum"} and all(f["tasks"] == 2 for f in h["families"].values())
    rows = results(Path(body["dir"]))
    assert sorted(r["key"] for r in rows) == sorted(f"t{t:05d}-{i}" for t in range(4) for i in range(3))
    for family, f in h["families"].items():  # pass@k as reported = the closed form over the results
        per_task = {}
        for r in rows:
            if r["family"] == family and r["mode"] == "sample":
                n, c = per_task.get(r["task"], (0, 0))
                per_task[r["task"]] = (n + 1, c + r["success"])
        for k in (1, 2):
            expected = sum(1 - comb(n - c, k) / comb(n, k) for n, c in per_task.values()) / len(per_task)
            assert f["pass_at_k"][str(k)]["value"] == pytest.approx(expected)
        greedy = [r["success"] for r in rows if r["family"] == family and r["mode"] == "greedy"]
        assert f["greedy"] == {"n": 2, "success": sum(greedy), "rate": sum(greedy) / 2}
    trajectories = stored(body["eval_id"])
    assert {r["trajectory_id"] for r in rows} == set(trajectories)
    assert {(t.phase, t.harness) for t in trajectories.values()} == {("eval", "tool_api_like")}
    query, found = cli.json("data", "query", "--run", body["eval_id"])
    assert query.exit_code == 0 and found["matched"] == EPISODES
    assert json.loads((Path(body["dir"]) / "summary.json").read_text())["all"] == body["all"]

    # the same evaluation, SIGKILLed once its first results are recorded
    first_port = free_port()
    log = tmp_path / "killed-eval.log"
    with log.open("w") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "agentrl_cli", "eval", str(random_model_dir), *PLAN, *sets(first_port)],
                                cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=stderr, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 180
        evals = []
        while not evals and time.monotonic() < deadline and proc.poll() is None:
            evals = [p for p in Path("runs").glob("eval-*") if p.name != body["eval_id"]]
            time.sleep(0.01)
        assert evals, log.read_text()
        killed_dir = evals[0]
        recorded = wait_for_lines(killed_dir / "results.jsonl", 1, proc, 180)
        assert proc.poll() is None, f"the evaluation ended (exit {proc.returncode}) before it could be killed: {log.read_text()}"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
    before = [r["key"] for r in results(killed_dir)]
    assert 1 <= recorded <= len(before) < EPISODES, "kill it earlier: it finished every episode"

    # resumed on another port: only the missing episodes are played, and the change is reported
    second_port = free_port()
    resumed, again = cli.json("eval", "--resume", killed_dir.name, *sets(second_port))
    assert resumed.exit_code == 0, resumed.stderr
    assert again["eval_id"] == killed_dir.name and again["resumed"] and again["attempts"] == 2
    assert again["planned_now"] == again["played_now"] == EPISODES - len(before)
    assert again["config_changes"] == [f"inference.port: {first_port} -> {second_port}"]
    final = results(killed_dir)
    assert [r["key"] for r in final if r["attempt"] == 0] == before
    replayed = [r["key"] for r in final if r["attempt"] == 1]
    assert sorted(replayed + before) == sorted(r["key"] for r in rows)  # each planned episode exactly once
    assert again["complete"] and again["harnesses"] == body["harnesses"] and again["all"] == body["all"]

    # episode by episode, the resumed evaluation played what the uninterrupted one did
    by_key = {r["key"]: r for r in rows}
    for r in final:
        assert (r["outcome"], r["reward"], r["completion_tokens"]) == (
            by_key[r["key"]]["outcome"], by_key[r["key"]]["reward"], by_key[r["key"]]["completion_tokens"]), r["key"]
    resumed_store = stored(killed_dir.name)
    assert {r["trajectory_id"] for r in final} <= set(resumed_store)
    tokens = {episode(tid): t.token_ids for tid, t in trajectories.items()}
    assert {episode(r["trajectory_id"]): resumed_store[r["trajectory_id"]].token_ids for r in final} == tokens

    # nothing left behind by the killed evaluation: its inference server went with it
    deadline = time.monotonic() + 60
    while not port_free(first_port) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert port_free(first_port)


def test_bad_input_exits_2_with_the_fix(cli, random_model_dir):
    unknown = cli("eval", str(random_model_dir), "--harness", "nope")
    assert unknown.exit_code == 2 and "not a configured harness" in unknown.stderr and "tool_api_like" in unknown.stderr
    few = cli("eval", str(random_model_dir), "-k", "1,4", "--samples", "2")
    assert few.exit_code == 2 and "--samples" in few.stderr and "pass@4" in few.stderr
    bad_k = cli("eval", str(random_model_dir), "-k", "0")
    assert bad_k.exit_code == 2 and "-k 1,4" in bad_k.stderr
    split = cli("eval", str(random_model_dir), "--harness", "tool_api_like", "--split", "holdout")
    assert split.exit_code == 2 and "its splits: eval, train" in split.stderr
    missing = cli("eval", "no-such-run")
    assert missing.exit_code == 2 and "no run under" in missing.stderr and "agentrl runs list" in missing.stderr
    empty_run = Path("runs/r0")
    empty_run.mkdir(parents=True)
    (empty_run / "meta.json").write_text("{}")
    no_checkpoint = cli("eval", "r0")
    assert no_checkpoint.exit_code == 2 and "no complete checkpoint" in no_checkpoint.stderr
    no_eval = cli("eval", "--resume", "latest")
    assert no_eval.exit_code == 2 and "no evaluation" in no_eval.stderr
    mixed = cli("eval", "--resume", "latest", "--harness", "tool_api_like")
    assert mixed.exit_code == 2 and "plays its own plan" in mixed.stderr


def test_a_run_is_evaluated_at_its_newest_checkpoint_exported_for_the_evaluation(cli, random_model_dir):
    from agentrl_cli.config.models import TrainingConfig
    from agentrl_cli.learner.checkpoint import CheckpointManager
    from agentrl_cli.learner.deepspeed_backend import DeepSpeedBackend

    backend = DeepSpeedBackend(random_model_dir, TrainingConfig(micro_batch_size=2))
    try:
        manager = CheckpointManager(Path("runs/r1/checkpoints"))
        for step in (1, 2):
            newest = manager.save(step, lambda d: backend.save_checkpoint(d / "engine", {"step": step}), {})
    finally:
        backend.close()
    result, body = cli.json("eval", "r1", "--harness", "tool_api_like", "--limit", "1", *sets(free_port()))
    assert result.exit_code == 0, result.stderr
    assert body["model"]["kind"] == "run" and body["model"]["step"] == 2 and body["model"]["checkpoint"] == str(newest.absolute())
    assert body["complete"] and body["samples"] == 0 and body["all"]["episodes"] == 2  # one greedy task per family
    assert body["harnesses"]["tool_api_like"]["pass_at_k"]["1"]["tasks"] == 2  # pass@1 over the greedy episodes
    assert not (Path(body["dir"]) / "export").exists()  # the exported model lived as long as the evaluation
    assert len(stored(body["eval_id"])) == 2
