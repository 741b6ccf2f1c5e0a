"""The Slurm executor's sbatch command line, without a cluster: Slurm's commands are answered by a
fake that records every argv. The training job (`agentrl job submit --training`) asks for
cluster.nodes nodes; any other job asks for one; the rendered slurm.conf lets a job span the cluster."""

from __future__ import annotations

import json

import pytest

from agentrl_cli.config.models import ControlPlaneConfig
from agentrl_cli.ops.controlplane.executor import JobSpec
from agentrl_cli.ops.controlplane.slurm import SlurmExecutor
from agentrl_cli.ops.controlplane.slurm_conf import SlurmHost, cluster_conf, single_node_conf

SLURM = ["--set", "controlplane.executor=slurm"]


@pytest.fixture
def sbatch_calls(monkeypatch) -> list[list[str]]:
    """Every argv the executor hands to Slurm; sbatch answers job id 7, squeue knows no job."""
    calls: list[list[str]] = []

    def run(self, argv: list[str], what: str) -> str:
        calls.append(list(argv))
        if argv[0] == "sinfo":
            return json.dumps({"nodes": [{"partitions": ["rollout", "train"]}]})
        if argv[0] == "squeue":
            return json.dumps({"jobs": []})
        if argv[0] == "sbatch":
            return "7\n"
        return ""
    monkeypatch.setattr(SlurmExecutor, "_run", run)
    monkeypatch.setattr("agentrl_cli.ops.controlplane.slurm.shutil.which", lambda name: f"/usr/bin/{name}")
    return calls


def _sbatch(calls: list[list[str]]) -> list[str]:
    found = [argv for argv in calls if argv[0] == "sbatch"]
    assert len(found) == 1, calls
    return found[0]


def test_a_job_spec_asks_sbatch_for_its_nodes(sbatch_calls):
    SlurmExecutor(ControlPlaneConfig()).submit(JobSpec("j1", "train", "low", 100, ["hostname"], nodes=2))
    argv = _sbatch(sbatch_calls)
    assert "--nodes=2" in argv and argv[-1] == "--wrap=hostname"


def test_the_training_job_spans_cluster_nodes_and_other_jobs_one_node(cli, sbatch_calls):
    result = cli("job", "submit", "--json", *SLURM, "--set", "cluster.nodes=2", "--pool", "train", "--training",
                 "--", "srun", "hostname")
    assert result.exit_code == 0, result.output
    job = json.loads(result.stdout)
    assert job["nodes"] == 2 and job["external_id"] == "7"
    assert "--nodes=2" in _sbatch(sbatch_calls)
    sbatch_calls.clear()
    result = cli("job", "submit", "--json", *SLURM, "--set", "cluster.nodes=2", "--pool", "rollout", "--", "true")
    job = json.loads(result.stdout)
    assert result.exit_code == 0 and job["nodes"] == 1 and "--nodes=1" in _sbatch(sbatch_calls)


def test_a_training_job_across_nodes_is_refused_where_the_executor_cannot_place_it(cli):
    result = cli("job", "submit", "--set", "cluster.nodes=2", "--pool", "train", "--training", "--", "true")
    assert result.exit_code == 2 and "only the slurm executor" in result.stderr and "controlplane.executor: slurm" in result.stderr


def test_a_cluster_conf_names_the_controller_and_each_node_and_lets_a_job_span_them():
    nodes = (SlurmHost("trainer-0", "198.18.0.2"), SlurmHost("trainer-1", "198.18.0.3"))
    conf = cluster_conf(ControlPlaneConfig(), controller=SlurmHost("slurmctld-0", "198.18.0.1"), nodes=nodes,
                        state_dir="/s", munge_socket="/m/munge.socket").splitlines()
    assert "SlurmctldHost=slurmctld-0(198.18.0.1)" in conf and "AuthInfo=cred_expire=10,socket=/m/munge.socket" in conf
    assert "NodeName=trainer-1 NodeAddr=198.18.0.3 CPUs=2 RealMemory=2000 State=UNKNOWN" in conf
    assert "SlurmdSpoolDir=/s/slurmd.%n" in conf  # nodes sharing one file system keep their spools apart
    train = next(line for line in conf if line.startswith("PartitionName=train"))
    assert "Nodes=trainer-0,trainer-1" in train and "MaxNodes=2" in train


def test_the_single_node_conf_is_the_cluster_conf_of_localhost():
    conf = single_node_conf(ControlPlaneConfig())
    assert conf == cluster_conf(ControlPlaneConfig())
    assert "SlurmctldHost=localhost\n" in conf and "AuthInfo=cred_expire=10\n" in conf and "MaxNodes=1 " in conf
    assert "NodeName=localhost NodeAddr=127.0.0.1 CPUs=2" in conf and "%n" not in conf


def test_render_lets_a_job_of_every_pool_span_cluster_nodes(cli):
    result = cli("controlplane", "render", "--executor", "slurm", "--set", "cluster.nodes=2")
    partitions = [line for line in result.stdout.splitlines() if line.startswith("PartitionName=")]
    assert result.exit_code == 0 and len(partitions) == 2 and all(" MaxNodes=2 " in line for line in partitions)
