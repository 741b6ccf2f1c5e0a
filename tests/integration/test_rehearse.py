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
import time
from pathlib import Path

import pytest

from agentrl_cli.config.models import PlatformConfig
from agentrl_cli.ops.rehearse.host import netns_names
from agentrl_cli.ops.rehearse.record import PREFIX, STATE_DIR
from agentrl_cli.ops.rehearse.rehearsal import Options, Rehearsal, unavailable

_problem = unavailable()
pytestmark = [pytest.mark.integration, pytest.mark.exclusive,
              pytest.mark.skipif(_problem is not None, reason=f"a rehearsal cannot run here: {_problem}")]
AGENTRL = [sys.executable, "-m", "agentrl_cli"]


def _host_state() -> dict:
    """What a rehearsal must leave as it found: namespaces, links, routes, mounts."""
    def out(*argv: str) -> str:
        return subprocess.run(argv, capture_output=True, text=True, check=True).stdout

    mounts = sorted(line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines())
    return {"netns": [n for n in netns_names() if n.startswith(PREFIX)], "links": out("ip", "-o", "link", "show"),
            "routes": out("ip", "route", "show", "table", "all"), "mounts": mounts}


def _settings(tmp_path: Path) -> list[str]:
    """Small and quick: a few episodes, the smoke phase."""
    return ["--set", f"observe.runs_dir={tmp_path / 'runs'}", "--set", "rollout.concurrency=4"]


def test_the_rehearsal_passes_across_the_nodes(tmp_path):
    before = _host_state()
    done = subprocess.run([*AGENTRL, "rehearse", "--json", "--dir", str(tmp_path / "rehearsal"), *_settings(tmp_path)],
                          capture_output=True, text=True, timeout=1800)
    assert done.stdout.strip(), done.stderr[-3000:]
    report = json.loads(done.stdout)
    failed = [c for c in report["checks"] if c["status"] == "fail"]
    assert done.returncode == 0 and report["ok"], json.dumps(failed, indent=1)[:6000] + done.stderr[-2000:]
    nodes = {n["name"]: n for n in report["nodes"]}
    assert len(nodes) == 12 and len({n["address"] for n in nodes.values()}) == 12
    assert all(n["address"].startswith("198.18.") for n in nodes.values())
    work = report["workload"]
    assert sorted(work["trainer_rank_hosts"]) == ["trainer-0", "trainer-1"]  # one rank on each trainer node
    assert all(v and v > 0 for v in work["sandbox_replicas"].values()), work["sandbox_replicas"]  # both replicas served
    assert work["job"]["job"]["state"] == "succeeded" and work["verify"]["exit"] == 0
    assert work["gateway"]["chat"] == 200
    assert report["refusals"] == []  # the workload used only planned openings
    fence = next(c for c in report["checks"] if c["name"].startswith("fence"))
    assert fence["status"] == "pass"  # and the sandbox node cannot reach the trainer's rendezvous port
    assert _host_state() == before


def test_a_plan_without_an_opening_fails_naming_role_and_port(tmp_path):
    cfg = PlatformConfig.model_validate({"observe": {"runs_dir": str(tmp_path / "runs")}})
    report = Rehearsal(Options(config=cfg, out_dir=tmp_path / "rehearsal", drop=("reward:8710",), up_deadline_s=240)).run()
    assert not report["ok"]
    assert [(r["clients"], r["listeners"], r["port"]) for r in report["refusals"]] == [(["controlplane", "trainer"], ["reward"], 8710)]
    message = report["refusals"][0]["message"] + report["refusals"][0]["fix"]
    assert "reward" in message and "8710" in message and "netplan.py" in message
    assert report["workload"]["job"] is None  # failed at bring-up, before the workload


def test_a_killed_rehearsal_is_reclaimed(tmp_path):
    before = _host_state()
    proc = subprocess.Popen([*AGENTRL, "rehearse", "--dir", str(tmp_path / "rehearsal"), *_settings(tmp_path)],
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
