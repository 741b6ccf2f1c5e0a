"""Slurm across simulated nodes: slurmctld on a node of its own and a slurmd on each of two trainer
nodes, with the slurm.conf agentrl renders for them; `agentrl job submit --training` with
controlplane.executor slurm and cluster.nodes 2 (run in the controller's node, as on a login node)
hands sbatch --nodes=2, and one step of the job runs on each trainer node. The training job itself
(stage 8's smoke on a random tiny model, cluster.nodes 2, no hostfile given) trains through two
ranks, one on each node of the allocation: the hostfile is written from SLURM_JOB_NODELIST and the
`deepspeed` launcher starts the ranks with pdsh over ssh (the trainer nodes run sshd, `trainers.py`).
Afterwards no daemon of the rehearsal runs and the host's namespaces are as they were, also after its
owner was SIGKILLed and `reclaim()` ran.

Every address used is from 198.18.0.0/15 inside namespaces this test creates; the machine's own
Slurm (/etc/slurm, /run/munge) is neither used nor touched."""

from __future__ import annotations

import json
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentrl_cli.config.models import PlatformConfig
from agentrl_cli.ops.controlplane.slurm_conf import SlurmHost, cluster_conf, network_notes
from agentrl_cli.ops.rehearse import slurm
from agentrl_cli.ops.rehearse.host import alive, netns_names, unavailable
from agentrl_cli.ops.rehearse.leftovers import reclaim
from agentrl_cli.ops.rehearse.nodes import Network
from agentrl_cli.ops.rehearse.record import run_of
from agentrl_cli.ops.rehearse.trainers import add_trainers
from agentrl_cli.ops.rehearse.trainers import unavailable as trainers_unavailable

_problem = unavailable() or slurm.unavailable()
needs_slurm_nodes = pytest.mark.skipif(_problem is not None, reason=f"Slurm on simulated nodes unavailable: {_problem}")
# serial("netns"): the rehearsal tests compare the host's named network namespaces and mounts before and
# after; another rehearsal's nodes must not appear in between (pytest-xdist runs test files side by side)
pytestmark = [pytest.mark.integration, pytest.mark.serial("netns")]
PY = sys.executable
SETTINGS = {"controlplane.executor": "slurm", "cluster.nodes": "2"}
# the job's own command: what Slurm allocated, then one step per allocated node (--ntasks-per-node=1:
# with one node allocated it would print one hostname)
JOB = 'echo "nodelist=$SLURM_JOB_NODELIST nodes=$SLURM_JOB_NUM_NODES on=$(hostname)"; srun --ntasks-per-node=1 hostname'


def _living(root: Path) -> list[str]:
    """Processes (not zombies) whose command line names `root`: the rehearsal's daemons and their jobs."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if entry.name.isdigit() and str(root) in cmdline and alive(int(entry.name), None):
            found.append(f"{entry.name} {cmdline}")
    return found


@needs_slurm_nodes
def test_the_training_job_spans_two_simulated_nodes_with_sbatch_nodes_2():
    host_namespaces = [n for n in netns_names() if run_of(n) is None]
    cfg = PlatformConfig.model_validate({"controlplane": {"executor": "slurm"}, "cluster": {"nodes": 2}})
    started = time.monotonic()
    with Network.create() as net:
        controller, trainers = net.add_node("slurmctld-0"), [net.add_node("trainer-0"), net.add_node("trainer-1")]
        cluster = slurm.start(cfg, controller, trainers)
        up_s = time.monotonic() - started
        rendered = cluster_conf(cfg.controlplane, controller=SlurmHost("slurmctld-0", controller.address),
                                nodes=tuple(SlurmHost(n.name, n.address) for n in trainers), state_dir=str(cluster.root / "state"),
                                run_dir=str(cluster.root / "run"), log_dir=str(cluster.logs), munge_socket=str(cluster.munge_socket))
        assert cluster.conf.read_text() == rendered + "\n".join(network_notes(cfg)) + "\n"  # agentrl's conf and notes, as is
        assert cluster.states() == {"trainer-0": "idle", "trainer-1": "idle"}

        sets = [x for key, value in SETTINGS.items() for x in ("--set", f"{key}={value}")]
        done = controller.run(cluster.client([PY, "-m", "agentrl_cli", "job", "submit", "--json", *sets, "--pool", "train",
                                              "--training", "--wait", "--timeout", "90", "--", "sh", "-c", JOB]), timeout=150)
        assert done.returncode == 0, done.stdout + done.stderr
        job = json.loads(done.stdout)
        assert job["state"] == "succeeded" and job["nodes"] == 2 and job["pool"] == "train", job
        shown = controller.run(cluster.client(["scontrol", "show", "job", "-o", job["external_id"]]), check=True).stdout
        assert " NumNodes=2 " in shown and " NodeList=trainer-[0-1] " in shown and " Partition=train " in shown, shown
        log = Path(job["log_path"]).read_text().splitlines()
        assert log[0] == "nodelist=trainer-[0-1] nodes=2 on=trainer-0", log  # the command runs on the first node
        assert sorted(log[1:]) == ["trainer-0", "trainer-1"], log  # and a step on each
        daemons = list(net.record.processes)
        assert len(daemons) >= 4 and all(alive(pid, start) for pid, start in daemons[:4])  # munged, slurmctld, 2 slurmd
        root = cluster.root
    assert not [p for p in daemons if alive(*p)] and _living(root) == [] and not root.exists()
    assert not [n for n in netns_names() if n.startswith(f"agrl-{net.run_id}-")]
    assert [n for n in netns_names() if run_of(n) is None] == host_namespaces
    print(f"cluster up in {up_s:.1f} s, all done in {time.monotonic() - started:.1f} s", file=sys.stderr)


_no_trainers = _problem or trainers_unavailable()
# stage 8's smoke through two ranks, small: two steps, then a resume from the checkpoint (two more)
TRAINING = {"cluster.nodes": "2", "training.world_size": "2", "training.micro_batch_size": "1",
            "training.start_timeout_s": "300", "stages.smoke_steps": "2", "rollout.group_size": "2",
            "rollout.max_steps_per_trajectory": "2", "inference.max_new_tokens": "16"}


def _sets(settings: dict) -> list[str]:
    return [x for key, value in settings.items() for x in ("--set", f"{key}={value}")]


@pytest.mark.skipif(_no_trainers is not None, reason=f"Slurm on trainer nodes unavailable: {_no_trainers}")
def test_the_training_job_trains_through_ranks_on_both_nodes_of_its_allocation(tmp_path, random_model_dir):
    started = time.monotonic()
    runs = tmp_path / "runs"  # the host's file system: every node sees it at the same path
    cfg = PlatformConfig.model_validate({"controlplane": {"executor": "slurm"}, "cluster": {"nodes": 2}})
    with Network.create() as net:
        controller = net.add_node("slurmctld-0")
        trainers = add_trainers(net, ("trainer-0", "trainer-1"), slots=1)
        trainers.start_sshd()
        cluster = slurm.start(cfg, controller, trainers.nodes)
        training = {**TRAINING, "model.path": random_model_dir, "observe.runs_dir": runs}
        stage8 = [PY, "-m", "agentrl_cli", "stage", "run", "8", "--phase", "smoke", *_sets(training)]
        # the job's environment is the submitter's (sbatch --export=ALL): gloo on the nodes' link, and no DLTS_HOSTFILE
        submit = ["env", "-u", "DLTS_HOSTFILE", "GLOO_SOCKET_IFNAME=eth0", PY, "-m", "agentrl_cli", "job", "submit", "--json",
                  *_sets(SETTINGS), "--pool", "train", "--training", "--wait", "--timeout", "900", "--", *stage8]
        done = controller.run(cluster.client(submit), timeout=960)
        job = json.loads(done.stdout) if done.stdout.strip().startswith("{") else {}
        log = Path(job["log_path"]).read_text(errors="replace") if job.get("log_path") else ""
        assert job.get("nodes") == 2 and job.get("external_id"), done.stdout + done.stderr
        shown = controller.run(cluster.client(["scontrol", "show", "job", "-o", job["external_id"]]), check=True).stdout
        assert " NumNodes=2 " in shown and " NodeList=trainer-[0-1] " in shown, shown
        [run] = list(runs.glob("*/stage8")) or [runs / "none"]
        assert run.is_dir(), log[-3000:]
        ranks_log = (run / "logs" / "trainer-ranks.log").read_text(errors="replace")
        reports = list(runs.glob("*/reports/stage-8.json"))
        report = json.loads(reports[0].read_text()) if reports else {}
        by_name = {c["name"]: c for c in report.get("checks", [])}
        for name in ("loss finite", "checkpoint written", "reloaded and resumed"):
            assert by_name.get(name, {}).get("status") == "pass", (name, by_name.get(name), log[-3000:], ranks_log[-3000:])
        # a random model may earn no reward: then stage 8 fails that check, and the job with it
        assert (job["state"] == "succeeded") == (by_name["reward distribution not degenerate"]["status"] == "pass"), job
        hostfile = run / "trainer-ranks" / "hostfile"  # written from the allocation, not given
        assert hostfile.read_text() == "trainer-0 slots=1\ntrainer-1 slots=1\n"
        assert ranks_log.count(f"--hostfile {hostfile} --num_nodes 2") == 2  # the first run and the resumed one
        assert "pdsh -S -f 1024 -w trainer-0,trainer-1" in ranks_log
        channel = json.loads((run / "trainer-ranks" / "channel.json").read_text())
        assert channel["hosts"] == ["trainer-0", "trainer-1"], channel
        root = cluster.root
    assert _living(root) == _living(run / "trainer-ranks") == [] and not root.exists()  # no daemon, step or rank is left
    print(f"the training job under Slurm took {time.monotonic() - started:.1f} s", file=sys.stderr)


REHEARSAL = """
import json, sys, time
from agentrl_cli.config.models import PlatformConfig
from agentrl_cli.ops.rehearse import slurm
from agentrl_cli.ops.rehearse.nodes import Network
net = Network.create()
controller, trainer = net.add_node("slurmctld-0"), net.add_node("trainer-0")
cluster = slurm.start(PlatformConfig(), controller, [trainer])
print(json.dumps({"run": net.run_id, "root": str(cluster.root), "daemons": net.record.processes[:3]}), flush=True)
time.sleep(600)
"""


@needs_slurm_nodes
def test_a_sigkilled_slurm_rehearsal_is_reclaimed_daemons_files_and_namespaces():
    host_namespaces = [n for n in netns_names() if run_of(n) is None]
    proc = subprocess.Popen([PY, "-c", REHEARSAL], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 90)
        assert ready, "the rehearsal did not report its cluster within 90 s"
        facts = json.loads(proc.stdout.readline())
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert all(alive(pid, start) for pid, start in facts["daemons"]) and Path(facts["root"]).is_dir()  # no teardown ran
    reclaim()
    assert not [p for p in facts["daemons"] if alive(*p)] and _living(Path(facts["root"])) == []
    assert not Path(facts["root"]).exists() and not [n for n in netns_names() if n.startswith(f"agrl-{facts['run']}-")]
    assert [n for n in netns_names() if run_of(n) is None] == host_namespaces
