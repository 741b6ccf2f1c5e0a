"""Stage 3 and the job commands against a real single-node Slurm (Debian's slurmctld, slurmd and munge,
no slurmdbd) whose slurm.conf agentrl renders from the default pools: partitions rollout (tier 1,
preemptible) and train (tier 10), quota licenses rollout_jobs:2 and train_jobs:1."""

from __future__ import annotations

import json

import pytest

from agentrl_cli.config.models import ControlPlaneConfig
from agentrl_cli.ops.controlplane.slurm_conf import single_node_conf
from tests.controlplane_services import slurm_missing, start_slurm

pytestmark = [pytest.mark.integration, pytest.mark.e2e]
SLURM = ["--set", "controlplane.executor=slurm", "--set", "controlplane.lease_seconds=1"]


@pytest.fixture(scope="module")
def slurm():
    why = slurm_missing()
    if why:
        pytest.skip(why)
    svc = start_slurm(single_node_conf(ControlPlaneConfig()))
    yield svc
    svc.stop()


def test_stage_3_passes_on_slurm_with_preemption_quota_reason_and_priority(cli, slurm):
    result, data = cli.json("stage", "run", "3", *SLURM)
    report = data["reports"][0]
    by_name = {c["name"]: c for c in report["checks"]}
    assert result.exit_code == 0 and report["status"] == "pass", [(c["name"], c["status"], c["detail"][:300]) for c in report["checks"]]
    assert all(c["status"] == "pass" for c in report["checks"]), [(c["name"], c["status"]) for c in report["checks"]]
    preempt = by_name["higher tier preempts a lower tier's job"]["measured"]
    assert preempt["requeued"] >= 1 and any("requeued 1x after preemption" in r for r in preempt["reasons"])
    assert by_name["job over quota waits and says why"]["measured"]["reason"] == "Licenses"
    assert "slurm partition rollout" in by_name["no-op job runs in its named pool"]["detail"]


def test_a_slurm_job_lands_in_its_partition_and_a_failure_keeps_its_exit_code(cli, slurm):
    result = cli("job", "submit", "--json", *SLURM, "--pool", "train", "--wait", "--timeout", "60", "--",
                 "sh", "-c", "echo in $SLURM_JOB_PARTITION; exit 3")
    job = json.loads(result.stdout)
    assert result.exit_code == 1 and job["state"] == "failed" and job["pool"] == "train" and job["exit_code"] == 3
    result, logs = cli.json("job", "logs", job["id"], *SLURM)
    assert logs["log"].startswith("in train")


def test_pools_that_are_not_partitions_are_refused_with_the_fix(cli, slurm):
    result = cli("job", "list", *SLURM, "--set", "controlplane.pools.0.name=gpu")
    assert result.exit_code == 2 and "pool(s) gpu are not Slurm partitions" in result.stderr
    assert "agentrl controlplane render --executor slurm" in result.stderr and "Traceback" not in result.output
