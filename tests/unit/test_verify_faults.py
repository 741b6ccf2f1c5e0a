"""Fault injection for `agentrl verify` and `agentrl troubleshoot --run`: each fault fails the right
layer with a check naming the segment, and the diagnosis ranks the matching knowledge-base entry
first with its evidence. The runs are small but real run directories (meta.json from create_run,
metrics.jsonl rows as the training run writes them, baseline.json, trajectories written by the real
trajectory writer, reports); components are real processes on loopback where a layer probes them.
"""

from __future__ import annotations

import json
import math
import random
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from agentrl_cli.config import load_config
from agentrl_cli.runtime.data.schema import StepRecord, ToolCallRecord, TrajectoryRecord
from agentrl_cli.runtime.data.writer import open_writer
from agentrl_cli.core.report import atomic_write_text
from agentrl_cli.acceptance.run_meta import create_run
from agentrl_cli.acceptance.troubleshoot.diagnose import diagnose
from agentrl_cli.acceptance.verify import verify
from tests.conftest import free_port

TRAIN = ("terminal_like", "code_sandbox_like")
HELD_OUT = "tool_api_like"
BASELINE = {"steps": 2, "time_shares": {"sampling": 0.55, "training": 0.35, "sync": 0.10}, "wall_s": 20.0, "timed_fraction": 0.95,
            "tokens_generated": 900, "tokens_per_s": 120.0, "tokens_per_s_per_stream": 40.0, "samples_per_min": 24.0,
            "server_busy_fraction": 0.6, "inference_queue_len_mean": 0.4, "env_steps": 30, "env_step_latency_s": 0.05,
            "env_failure_rate": 0.0, "episodes": 8}


def loaded_config(tmp_path: Path, *sets: str):
    base = [f"observe.runs_dir={tmp_path / 'runs'}", f"data.root={tmp_path / 'data'}", "data.rows_per_file=64"]
    return load_config(None, base + list(sets))


def rows(steps: int = 20, *, reward=lambda i: 0.2 + 0.02 * i, lr: float = 3e-4, masked: int = 0, shares=(0.55, 0.35, 0.10),
         seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out, tokens = [], 0
    for i in range(1, steps + 1):
        tokens += 400
        r = reward(i)
        out.append({"step": i, "version": i, "elapsed_s": 10.0 * i, "train/loss": 0.1 + rng.uniform(-0.05, 0.05),
                    "train/grad_norm": 1.0 + rng.uniform(-0.2, 0.2), "train/entropy": 0.5 + rng.uniform(-0.05, 0.05),
                    "train/mismatch_kl": 1e-4, "train/lr": lr, "train/samples": 8 - masked,
                    "reward/mean": None if r is None else r + rng.uniform(-0.01, 0.01), "reward/std": 0.0 if r is None else 0.3,
                    "reward/success_rate": None if r is None else min(1.0, r), "reward/masked": masked,
                    "time/sampling_wait_s": 10 * shares[0], "time/train_s": 10 * shares[1], "time/sync_s": 10 * shares[2],
                    "rollout/tokens_generated": tokens, "rollout/env_failures": 0, "rollout/episode_errors": 0,
                    "rollout/infra_errors": 0})
    return out


def evals(before: dict, after: dict, steps: int = 20) -> list[dict]:
    return [{"step": 0, "version": 0, **{f"eval/{h}/success_rate": v for h, v in before.items()}},
            {"step": steps, "version": steps, **{f"eval/{h}/success_rate": v for h, v in after.items()}}]


HEALTHY_EVALS = ({"terminal_like": 0.3, "code_sandbox_like": 0.3, HELD_OUT: 0.3},
                 {"terminal_like": 0.6, "code_sandbox_like": 0.5, HELD_OUT: 0.45})


def make_run(loaded, *, metrics=None, eval_rows=None, probe=None, trajectories=None, extra=None):
    """A run as stage 0 and stage 8 leave it: baseline, stage8/metrics.jsonl, the store, verify's extras.
    `trajectories`: run id -> the trajectories to store."""
    run = create_run(loaded)
    metrics = rows() if metrics is None else metrics
    eval_rows = evals(*HEALTHY_EVALS) if eval_rows is None else eval_rows
    atomic_write_text(run.path / "baseline.json", json.dumps(BASELINE))
    lines = [eval_rows[0], *metrics, *eval_rows[1:]]
    atomic_write_text(run.path / "stage8" / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in lines))
    atomic_write_text(run.path / "verify" / "probe.json", json.dumps(probe or BASELINE))
    if extra is not None:
        atomic_write_text(run.path / "verify" / "extra.json", json.dumps(extra))
    writer = open_writer(loaded.config.data)
    for t in (trajectories or trajectory_set)(run.run_id):
        assert writer.write(t)
    writer.close()
    return run


def trajectory(run_id: str, i: int, reward: float, *, harness: str = "terminal_like", status: str = "ok") -> TrajectoryRecord:
    task = f"{harness}/arith/train/{i % 6:04d}"
    return TrajectoryRecord(run_id=run_id, task_id=task, harness=harness, harness_version="1", phase="short",
                            initial_observation=f"Compute task {i % 6}", reward=reward, reward_status="ok",
                            outcome="success" if reward >= 1 else "fail", turns=1 + i % 3,
                            steps=[StepRecord(0, "<tool_call>...</tool_call>", "ok", tool_calls=[ToolCallRecord("bash", status=status)])])


def trajectory_set(run_id: str, reward=lambda i: [0.0, 0.2, 1.2, 0.1][i % 4]) -> list[TrajectoryRecord]:
    return [trajectory(run_id, i, reward(i), harness=TRAIN[i % 2]) for i in range(40)]


def failing(report, layer: str) -> list:
    return [c for c in report.layers[layer] if c.status == "fail"]


def first_finding(run, loaded):
    findings = diagnose(run, loaded.config)
    assert findings, "the diagnosis found nothing"
    return findings[0], findings


# ---- a healthy run ------------------------------------------------------------------------------


def test_a_healthy_run_passes_every_judged_layer_and_the_diagnosis_finds_nothing(tmp_path):
    loaded = loaded_config(tmp_path)
    extra = {"canaries": [{"task": "terminal_like/canary/eval/0000", "reward": 0.2, "outcome_score": 0.0, "outcome": "fail"}],
             "repeats": [{"task_id": "terminal_like/arith/eval/0000", "rewards": [0.2, 0.2]}],
             "resume": {"ok": True, "checkpoint": "step-00000005", "resumed_from": "step-00000005", "start_step": 5, "end_step": 6}}
    run = make_run(loaded, extra=extra)
    report = verify(loaded, run, layers=["correctness", "performance", "convergence", "cross_harness"], measure=False)
    bad = [(c.name, c.detail) for c in report.checks() if c.status == "fail"]
    assert report.status == "pass", bad
    judged = {k: [c.status for c in v] for k, v in report.layers.items()}
    assert all("pass" in statuses for statuses in judged.values()), judged
    assert diagnose(run, loaded.config) == []


# ---- faults -------------------------------------------------------------------------------------


def test_reward_service_dead_fails_connectivity_with_the_address_and_is_diagnosed(tmp_path):
    port = free_port()
    loaded = loaded_config(tmp_path, f"reward.service_url=http://127.0.0.1:{port}", f"inference.urls=[\"http://127.0.0.1:{port}\"]")
    run = make_run(loaded, metrics=rows(reward=lambda i: None, masked=8), trajectories=lambda run_id: [])
    report = verify(loaded, run, layers=["connectivity"], measure=False)
    [reward] = [c for c in failing(report, "connectivity") if c.name.startswith("reward service")]
    assert f"127.0.0.1:{port}" in reward.detail and "agentrl serve reward" in reward.hint
    atomic_write_text(run.reports / "verify.json", json.dumps(report.to_dict(), default=str))
    top, _ = first_finding(run, loaded)
    assert top.entry.id == "reward-service-down"
    assert any("not scored" in h.summary for _, h in top.hits) and any("reward service" in h.summary for _, h in top.hits)


class MaxReward(BaseHTTPRequestHandler):
    """A reward service that always answers the maximum: the fault the seed calls 'reward pinned at the top'."""

    def do_GET(self):  # noqa: N802 - http.server's name
        self._send({"status": "ok"})

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        items = body.get("items") or [body]
        results = [{"trajectory_id": it["trajectory_id"], "reward": 1.2, "components": {"outcome": 1.0, "format": 1.0, "tool_legality": 1.0},
                    "status": "ok", "outcome": "success", "verifier": "answer", "verifier_versions": {"answer": "1"}} for it in items]
        self._send({"results": results} if "items" in body else results[0])

    def _send(self, data):
        raw = json.dumps(data).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args):
        pass


@pytest.fixture
def max_reward_service():
    server = ThreadingHTTPServer(("127.0.0.1", 0), MaxReward)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_a_reward_that_always_returns_the_maximum_fails_correctness_and_is_diagnosed(tmp_path, max_reward_service):
    loaded = loaded_config(tmp_path, f"reward.service_url={max_reward_service}")
    run = make_run(loaded, metrics=rows(reward=lambda i: 1.2), trajectories=lambda run_id: trajectory_set(run_id, reward=lambda i: 1.2))
    report = verify(loaded, run, layers=["correctness"], measure=False)
    names = {c.name for c in failing(report, "correctness")}
    assert "reward not pinned at the achievable maximum" in names
    assert "canaries score 0: answers a cheating agent tries (scored now)" in names
    pinned = next(c for c in report.layers["correctness"] if c.name == "reward not pinned at the achievable maximum")
    assert pinned.measured["fraction_at_max"] == 1.0 and math.isclose(pinned.measured["achievable_max"], 1.2)
    top, _ = first_finding(run, loaded)
    assert top.entry.id == "reward-pinned-at-max"
    assert "at the achievable maximum 1.2" in top.hits[0][1].summary


def test_an_environment_slowed_five_times_fails_performance_naming_the_segment(tmp_path):
    loaded = loaded_config(tmp_path)
    slow = {**BASELINE, "env_step_latency_s": 0.25, "time_shares": {"sampling": 0.85, "training": 0.12, "sync": 0.03},
            "samples_per_min": 9.0, "tokens_per_s": 70.0}
    run = make_run(loaded, probe=slow)
    report = verify(loaded, run, layers=["performance"], measure=False)
    bad = {c.name: c for c in failing(report, "performance")}
    latency = bad["environment step latency vs baseline"]
    assert latency.measured == {"now": 0.25, "baseline": 0.05, "drift": 4.0}
    assert "environment steps are slower" in latency.detail
    assert "sampling (generation and environment) is the bottleneck" in bad["sampling share vs baseline"].detail
    assert "sampling share 0.85 vs baseline 0.55" in bad["sampling share vs baseline"].detail
    top, _ = first_finding(run, loaded)
    assert top.entry.id == "env-step-slow"
    assert "(5.0x)" in top.hits[0][1].summary


def test_a_machine_faster_than_its_baseline_passes_and_is_told_to_rebaseline(tmp_path):
    loaded = loaded_config(tmp_path)
    fast = {**BASELINE, "tokens_per_s": 225.0, "samples_per_min": 45.0, "env_step_latency_s": 0.02,
            "time_shares": {"sampling": 0.45, "training": 0.42, "sync": 0.13}}
    run = make_run(loaded, probe=fast)
    report = verify(loaded, run, layers=["performance"], measure=False)
    assert failing(report, "performance") == []
    tokens = next(c for c in report.layers["performance"] if c.name == "tokens/s (generation throughput) vs baseline")
    assert tokens.status == "pass" and tokens.measured["drift"] == 0.875
    assert "generation is faster than at the baseline" in tokens.detail and "rerun `agentrl stage run 0`" in tokens.detail


def test_learning_rate_zero_fails_convergence_and_is_diagnosed(tmp_path):
    loaded = loaded_config(tmp_path)
    run = make_run(loaded, metrics=rows(reward=lambda i: 0.3, lr=0.0), eval_rows=evals(HEALTHY_EVALS[0], HEALTHY_EVALS[0]))
    report = verify(loaded, run, layers=["convergence"], measure=False)
    [slope] = failing(report, "convergence")
    assert slope.name == "reward slope positive (95% lower bound > 0)" and slope.measured["lower_95"] <= 0
    top, _ = first_finding(run, loaded)
    assert top.entry.id == "training-not-converging"
    assert "learning rate 0.0" in top.hits[0][1].summary


def test_a_held_out_harness_with_a_changed_tool_call_format_fails_cross_harness(tmp_path):
    loaded = loaded_config(tmp_path)
    after = {"terminal_like": 0.6, "code_sandbox_like": 0.5, HELD_OUT: 0.05}  # its tool calls no longer parse
    run = make_run(loaded, eval_rows=evals(HEALTHY_EVALS[0], after))
    report = verify(loaded, run, layers=["cross_harness"], measure=False)
    [drop] = failing(report, "cross_harness")
    assert drop.name == f"held-out harness {HELD_OUT} vs training harnesses" and drop.measured["drop"] == 0.5
    assert "unify prompt and tool-description style" in drop.hint
    top, _ = first_finding(run, loaded)
    assert top.entry.id == "held-out-harness-drop"
    assert f"held-out {HELD_OUT} 0.30 -> 0.05 vs training harnesses 0.30 -> 0.55 (fell behind by 0.50)" in top.hits[0][1].summary


def test_a_gap_that_was_there_before_training_is_not_counted_and_a_never_solved_harness_is_not_judged(tmp_path):
    """The training harnesses rise by 0.25 while the held-out one holds at 0.1: only the 0.25 the
    training added counts. Held at 0 before and after, the harness shows nothing about transfer."""
    loaded = loaded_config(tmp_path)
    before = {"terminal_like": 0.1, "code_sandbox_like": 0.0, HELD_OUT: 0.1}
    after = {"terminal_like": 0.4, "code_sandbox_like": 0.2, HELD_OUT: 0.1}
    run = make_run(loaded, eval_rows=evals(before, after))
    [check] = verify(loaded, run, layers=["cross_harness"], measure=False).layers["cross_harness"]
    assert check.status == "pass" and check.measured["drop"] == 0.25
    never = make_run(loaded, eval_rows=evals({**before, HELD_OUT: 0.0}, {**after, "terminal_like": 0.8, HELD_OUT: 0.0}))
    [check] = verify(loaded, never, layers=["cross_harness"], measure=False).layers["cross_harness"]
    assert check.status == "skip" and check.measured["drop"] == 0.45 and "scored 0 before and after" in check.detail
    assert "held-out-harness-drop" not in {f.entry.id for f in diagnose(never, loaded.config)}


def counted(curve: list[float], episodes: int = 24, steps: int = 60) -> list[dict]:
    """Evaluation rows with episode counts, as the training run writes them, every 20 steps."""
    return [{"step": i * 20, "version": i * 20, **{f"eval/{h}/success_rate": r for h in (*TRAIN, HELD_OUT)},
             **{f"eval/{h}/episodes": episodes for h in (*TRAIN, HELD_OUT)}} for i, r in enumerate(curve)]


def test_convergence_judges_the_evaluation_curve_when_the_curriculum_holds_the_training_reward_flat(tmp_path):
    loaded = loaded_config(tmp_path)
    flat = rows(steps=60, reward=lambda i: 0.6)  # the curriculum keeps drawing tasks solved about half the time
    run = make_run(loaded, metrics=flat, eval_rows=counted([0.083, 0.208, 0.25, 0.375]))
    [progress] = [c for c in verify(loaded, run, layers=["convergence"], measure=False).layers["convergence"]
                  if "rises" in c.name or "slope" in c.name]
    assert progress.name == "evaluation success rises (95% lower bound > 0)" and progress.status == "pass", progress.measured
    assert progress.measured["episodes"] == 4 * 48 and progress.measured["lower_95"] > 0
    run = make_run(loaded, metrics=flat, eval_rows=counted([0.25, 0.208, 0.25, 0.25]))
    [progress] = failing(verify(loaded, run, layers=["convergence"], measure=False), "convergence")
    assert progress.name == "evaluation success rises (95% lower bound > 0)" and progress.measured["lower_95"] <= 0
    assert first_finding(run, loaded)[0].entry.id == "training-not-converging"


def test_most_trajectories_at_the_maximum_is_a_policy_that_learned_nearly_all_is_pinned(tmp_path):
    loaded = loaded_config(tmp_path)
    for share, status in ((0.6, "pass"), (0.95, "fail")):
        run = make_run(loaded, trajectories=lambda rid: trajectory_set(rid, lambda i: 1.2 if (i % 20) < share * 20 else 0.2))
        [pinned] = [c for c in verify(loaded, run, layers=["correctness"], measure=False).layers["correctness"]
                    if c.name == "reward not pinned at the achievable maximum"]
        assert pinned.status == status and pinned.measured["fraction_at_max"] == share


def test_a_canary_scored_positive_fails_correctness_and_is_diagnosed(tmp_path):
    loaded = loaded_config(tmp_path)
    extra = {"canaries": [{"task": "terminal_like/canary/eval/0000", "reward": 1.2, "outcome_score": 1.0, "outcome": "success"},
                          {"task": "tool_api_like/canary/eval/0000", "reward": 0.2, "outcome_score": 0.0, "outcome": "fail"}]}
    run = make_run(loaded, extra=extra)
    report = verify(loaded, run, layers=["correctness"], measure=False)
    [canary] = failing(report, "correctness")
    assert canary.name == "canaries score 0: the policy's own attempts"
    assert canary.measured["positive"][0]["task"] == "terminal_like/canary/eval/0000"
    top, _ = first_finding(run, loaded)
    assert top.entry.id == "canary-rewarded" and "terminal_like/canary/eval/0000" in top.hits[0][1].summary
