"""`agentrl rehearse`: the deployment on twelve simulated nodes of this machine, fenced by rules from
the plan. The whole rehearsal passes (stage 8 smoke as a control-plane job whose state is in
PostgreSQL, two trainer ranks on two nodes, both inference servers behind the router, both sandbox
replicas behind HAProxy, reward, gateway and S3 on their nodes, `agentrl verify` on the run); a plan
without the reward service's opening fails, naming the role and the port; a SIGKILLed rehearsal
leaves nothing once `agentrl sandbox reclaim` ran.

Root only (network namespaces); skipped with the reason where a program is missing. Exclusive: the
host's namespaces are compared before and after."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from agentrl_cli.config.models import PlatformConfig
from agentrl_cli.ops.rehearse.host import netns_names
from agentrl_cli.ops.rehearse.leftovers import reclaim
from agentrl_cli.ops.rehearse.record import PREFIX, STATE_DIR
from agentrl_cli.acceptance.rehearsal.rehearsal import Options, Rehearsal, unavailable

_problem = unavailable()
pytestmark = [pytest.mark.integration, pytest.mark.serial("netns"),
              pytest.mark.skipif(_problem is not None, reason=f"a rehearsal cannot run here: {_problem}")]
AGENTRL = [sys.executable, "-m", "agentrl_cli"]


def _host_state() -> dict:
    """What a rehearsal must leave as it found: namespaces, links, routes, mounts (less those in other
    tests' temporary directories: a test beside this one may mount a tmpfs in its own; this test's own,
    its working directory, are kept)."""
    def out(*argv: str) -> str:
        return subprocess.run(argv, capture_output=True, text=True, check=True).stdout

    mine, tests = f"{Path.cwd()}/", f"{tempfile.gettempdir()}/pytest-of-"
    points = (line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines())
    mounts = sorted(p for p in points if p.startswith(mine) or not p.startswith(tests))
    return {"netns": [n for n in netns_names() if n.startswith(PREFIX)], "links": out("ip", "-o", "link", "show"),
            "routes": out("ip", "route", "show", "table", "all"), "mounts": mounts}


def _reclaimed_host_state() -> dict:
    """The host as a rehearsal will find it: a dead rehearsal's leftovers (another test's, here) are
    what every rehearsal reclaims as it starts, so they are reclaimed before the comparison's
    `before` (a rehearsal test that ran earlier in the session left four namespaces once in CI)."""
    reclaim()
    return _host_state()


# the stage 8 checks that say the deployment trained: what a random model cannot change
DEPLOYMENT_CHECKS = ("loss finite", "checkpoint written", "reloaded and resumed", "no trajectory stored twice")
MODEL_QUALITY = "reward distribution not degenerate"  # a random model's rewards are all alike: it fails, never passes quietly


def _settings(tmp_path: Path, model: Path | None = None) -> list[str]:
    """Small and quick: a few episodes, short turns; `model` (a directory) instead of the built-in model."""
    sets = ["--set", f"observe.runs_dir={tmp_path / 'runs'}", "--set", "rollout.concurrency=4"]
    if model is not None:
        sets += ["--set", f"model.path={model}", "--set", "inference.max_new_tokens=16", "--set", "stages.smoke_steps=4",
                 "--set", "rollout.max_steps_per_trajectory=2", "--set", "rollout.group_size=2",
                 "--set", "training.micro_batch_size=2"]
    return sets


def _rehearse(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    done = subprocess.run([*AGENTRL, "rehearse", "--json", "--dir", str(tmp_path / "rehearsal"), *args],
                          capture_output=True, text=True, timeout=1800)
    assert done.stdout.strip(), done.stderr[-3000:]
    return done, json.loads(done.stdout)


def _deployment_passed(report: dict, before: dict) -> dict:
    """Every check of the deployment passed: the roles on their nodes, the traffic between them, the
    rules; returns the checks by name."""
    checks = {c["name"]: c for c in report["checks"]}
    nodes = {n["name"]: n for n in report["nodes"]}
    assert len(nodes) == 12 and len({n["address"] for n in nodes.values()}) == 12
    assert all(n["address"].startswith("198.18.") for n in nodes.values())
    work = report["workload"]
    assert sorted(work["trainer_rank_hosts"]) == ["trainer-0", "trainer-1"]  # one rank on each trainer node
    assert all(v and v > 0 for v in work["sandbox_replicas"].values()), work["sandbox_replicas"]  # both replicas served
    assert work["gateway"]["chat"] == 200  # an agent's call from a sandbox node through the gateway node
    assert report["refusals"] == []  # the workload used only planned openings
    assert {u["node"] for u in report["openings"]["used"]} == set(nodes)  # and every node let planned traffic in
    fence = next(c for c in report["checks"] if c["name"].startswith("fence"))
    assert fence["status"] == "pass"  # and the sandbox node cannot reach the trainer's rendezvous port
    for name in ("services up on their nodes", "trajectory store bucket on the S3 node", "ledger: nothing lost or stored twice",
                 "both inference servers behind the router served the run and its weights"):
        assert checks[name]["status"] == "pass", checks[name]
    assert report["teardown"]["errors"] == 0 and _host_state() == before
    return checks


def test_the_rehearsal_trains_across_the_nodes(tmp_path, random_model_dir):
    """CI's rehearsal, on a random model (the built-in one is built once, in about 10 minutes): the
    deployment's checks all pass and stage 8 trained across the nodes; the one check a random model
    fails is the reward's spread, and with it the job and verify."""
    before = _reclaimed_host_state()
    done, report = _rehearse(tmp_path, *_settings(tmp_path, random_model_dir))
    _deployment_passed(report, before)
    stage8 = json.loads(Path(report["workload"]["job"]["stage8_report"]).read_text())
    status = {c["name"]: c["status"] for c in stage8["checks"]}
    assert all(status[n] == "pass" for n in DEPLOYMENT_CHECKS), status
    assert [n for n, v in status.items() if v == "fail"] in ([], [MODEL_QUALITY])
    assert report["ok"] == (done.returncode == 0) == (status[MODEL_QUALITY] == "pass")


@pytest.mark.builtin
def test_the_rehearsal_passes_with_the_built_in_model(tmp_path):
    """`agentrl rehearse --json` as a user runs it: every check passes, the job, stage 8 and verify included."""
    before = _reclaimed_host_state()
    done, report = _rehearse(tmp_path, *_settings(tmp_path))
    failed = [c for c in report["checks"] if c["status"] == "fail"]
    assert done.returncode == 0 and report["ok"], json.dumps(failed, indent=1)[:6000] + done.stderr[-2000:]
    _deployment_passed(report, before)
    assert report["workload"]["job"]["job"]["state"] == "succeeded" and report["workload"]["verify"]["exit"] == 0


@pytest.mark.long
def test_the_rehearsal_recovers_from_node_faults(tmp_path, random_model_dir):
    """`agentrl rehearse --chaos` (about 2 minutes here): inference-1's link cut, the sandbox replica on
    sandbox-1 killed, every process of inference-0 killed, each while the run trains; each recovered
    within its bound, and nothing lost or stored twice."""
    before = _reclaimed_host_state()
    done, report = _rehearse(tmp_path, "--chaos", *_settings(tmp_path, random_model_dir))
    checks = _deployment_passed(report, before)
    faults = {f["kind"]: f for f in report["faults"]}
    assert set(faults) == {"link cut", "replica kill", "node kill"}
    for f in faults.values():
        assert f["injected"] and f["recovered"] and f["recovery_s"] <= f["bound_s"], f
        assert checks[f"chaos: {f['kind']} ({f['node']}) recovered"]["status"] == "pass"
    ledger = report["workload"]["ledger"]
    assert ledger["missing"] == 0 and ledger["duplicated"] == 0 and ledger["trained"] > 0


def test_a_plan_without_an_opening_fails_naming_role_and_port(tmp_path, random_model_dir):
    cfg = PlatformConfig.model_validate({"observe": {"runs_dir": str(tmp_path / "runs")}, "model": {"path": str(random_model_dir)}})
    report = Rehearsal(Options(config=cfg, out_dir=tmp_path / "rehearsal", drop=("reward:8710",), up_deadline_s=240)).run()
    assert not report["ok"]
    assert [(r["clients"], r["listeners"], r["port"]) for r in report["refusals"]] == [(["controlplane", "trainer"], ["reward"], 8710)]
    message = report["refusals"][0]["message"] + report["refusals"][0]["fix"]
    assert "reward" in message and "8710" in message and "netplan.py" in message
    assert report["workload"]["job"] is None  # failed at bring-up, before the workload


def test_a_killed_rehearsal_is_reclaimed(tmp_path, random_model_dir):
    before = _reclaimed_host_state()
    proc = subprocess.Popen([*AGENTRL, "rehearse", "--dir", str(tmp_path / "rehearsal"), *_settings(tmp_path, random_model_dir)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 300
    try:
        while True:  # until its services run on their nodes
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            records = [json.loads(p.read_text()) for p in STATE_DIR.glob("*.json")] if STATE_DIR.is_dir() else []
            mine = [r for r in records if int(r["run"].split("-")[0]) == proc.pid]
            if mine and len(mine[0]["namespaces"]) >= 13 and len(mine[0]["processes"]) >= 10:
                break
            assert time.monotonic() < deadline, "the rehearsal never started its services"
            time.sleep(0.5)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert any(n.startswith(f"{PREFIX}{proc.pid}-") for n in netns_names())  # it did leave nodes behind
    done = subprocess.run([*AGENTRL, "sandbox", "reclaim", "--json"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["rehearsal"]["namespaces"] >= 13
    assert _host_state() == before
