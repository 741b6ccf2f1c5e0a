"""Two trainer ranks on two simulated nodes, started as on a cluster: `RanksBackend` with
`cluster.nodes: 2` runs the real `deepspeed` launcher on trainer-0, which checks ssh, starts both
nodes' ranks with pdsh over ssh (each node runs its own sshd), and the ranks meet on
`training.master_port`; one train step returns a finite loss, behind firewall rules from the plan
that refuse nothing; after the teardown no sshd or rank is left, nor any namespace or directory the run made.

Every address used is from 198.18.0.0/15 inside namespaces this test creates; the host's sshd
configuration and root's ~/.ssh are never written (the nodes mount generated ones)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from agentrl_cli.config.models import PlatformConfig
from agentrl_cli.ops.netplan import openings
from agentrl_cli.ops.rehearse import firewall
from agentrl_cli.ops.rehearse.host import alive, netns_names
from agentrl_cli.ops.rehearse.nodes import Network
from agentrl_cli.ops.rehearse.trainers import PRIVSEP_DIR, add_trainers, unavailable

_problem = unavailable() or firewall.unavailable()
pytestmark = [pytest.mark.integration, pytest.mark.serial("netns"),  # serial("netns"): see test_rehearse_firewall.py
              pytest.mark.skipif(_problem is not None, reason=f"trainer nodes unavailable: {_problem}")]
PY = sys.executable
SETTINGS = {"cluster": {"nodes": 2}, "training": {"world_size": 2, "micro_batch_size": 1, "start_timeout_s": 300}}

# Run in trainer-0 with the model directory and the run directory: one step of two ranks, the facts as JSON.
DRIVER = """
import json, sys
from pathlib import Path
from agentrl_cli.config.models import PlatformConfig
from agentrl_cli.learner.grpo import Sample
from agentrl_cli.learner.ranks_backend import RanksBackend
cfg = PlatformConfig.model_validate({**json.loads(sys.argv[3]), "model": {"path": sys.argv[1]}})
ids = list(range(10, 40))
samples = [Sample(ids, [0] * 10 + [1] * 20, [-3.0] * 30, advantage) for advantage in (1.0, -1.0)]
backend = RanksBackend(sys.argv[1], cfg, Path(sys.argv[2]))
try:
    metrics = backend.train_step(samples)
    environ = dict(v.split("=", 1) for v in Path(f"/proc/{backend.pids[1]}/environ").read_text().split("\\0") if "=" in v)
    print(json.dumps({"hosts": backend.hosts, "pids": backend.pids, "loss": metrics["loss"], "rank1_env": environ}), flush=True)
finally:
    backend.close()
"""


def _ours(*marks: str) -> list[int]:
    """Live processes whose command line names one of `marks` (this run's files, its control directory)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace") if entry.name.isdigit() else ""
        except OSError:
            continue
        if any(m in cmdline for m in marks) and alive(int(entry.name), None):
            found.append(int(entry.name))
    return found


def test_two_ranks_on_two_nodes_start_through_pdsh_and_ssh_and_train_one_step_within_the_plan(tmp_path, random_model_dir):
    privsep_before = PRIVSEP_DIR.exists()
    runs, seen_as = tmp_path / "runs", tmp_path / "mnt" / "runs"
    runs.mkdir()
    cfg = PlatformConfig.model_validate(SETTINGS)
    plan = openings(cfg)
    with Network.create(shared={str(seen_as): runs}) as net:
        trainers = add_trainers(net, ["trainer-0", "trainer-1"], slots=1)
        placement = {"trainer": [n.address for n in trainers.nodes]}
        for node in trainers.nodes:
            firewall.apply(node, plan, placement)
        sshd = trainers.start_sshd()
        env = [f"{k}={v}" for k, v in trainers.env.items()]
        done = trainers.nodes[0].run(["env", *env, PY, "-c", DRIVER, str(random_model_dir), str(seen_as / "run"),
                                      json.dumps(SETTINGS)], timeout=420)
        log = (runs / "run" / "logs" / "trainer-ranks.log").read_text(errors="replace")
        assert done.returncode == 0, f"{done.stderr[-3000:]}\n--- trainer-ranks.log ---\n{log[-4000:]}"
        facts = json.loads(done.stdout.splitlines()[-1])
        assert facts["hosts"] == ["trainer-0", "trainer-1"]  # rank 0 on the first host of the hostfile, rank 1 on the other
        assert math.isfinite(facts["loss"])
        remote = facts["rank1_env"]  # what ssh gave rank 1 on trainer-1: the launcher's exports and its env file's
        assert (remote["DS_ACCELERATOR"], remote["GLOO_SOCKET_IFNAME"], remote["OMP_NUM_THREADS"].isdigit()) == ("cpu", "eth0", True)
        assert remote["PYTHONPATH"].split(":")[0] == str(Path.cwd()) and "SSH_CONNECTION" in remote
        assert "pdsh -S -f 1024 -w trainer-0,trainer-1" in log  # the launcher's multi-node path, not torchrun
        assert f"Accepted publickey for root from {trainers.nodes[0].address}" in trainers.log(trainers.nodes[1]).read_text()
        found = firewall.refusals(trainers.nodes, plan, placement)
        assert found == [], [r.message for r in found]  # ssh, the rendezvous and gloo stayed inside the plan's openings
        control = str(seen_as / "run" / "trainer-ranks")
    assert all(p.returncode is not None for p in sshd)
    assert not any(alive(pid, None) for pid in facts["pids"])
    assert _ours(str(net.record.files), control) == []
    # this run's namespaces only: other rehearsals on this machine may come and go meanwhile
    assert not [n for n in netns_names() if n.startswith(f"agrl-{net.run_id}-")]
    assert PRIVSEP_DIR.exists() == privsep_before and not net.record.files.exists()
