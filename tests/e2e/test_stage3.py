"""`agentrl stage run 3` on the default config (SQLite, local executor) and with the Kubernetes executor
and no cluster configured. Slurm and PostgreSQL runs are in tests/integration/test_slurm.py and test_postgres.py."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.integration]
FAST_LEASE = ["--set", "controlplane.lease_seconds=1"]


def test_stage_3_passes_on_the_default_config(cli):
    result, data = cli.json("stage", "run", "3", *FAST_LEASE)
    report = data["reports"][0]
    by_name = {c["name"]: c for c in report["checks"]}
    assert result.exit_code == 0 and report["status"] == "pass", [(c["name"], c["status"], c["detail"][:300]) for c in report["checks"]]
    assert by_name["state store reachable and writable"]["measured"]["schema_version"] >= 1
    assert by_name["one leader among two instances"]["measured"] == {"instances": 2, "leaders": 1, "term": 1}
    assert by_name["failover within the lease"]["measured"]["new_term"] == 2
    assert "fencing token 1 is stale" in by_name["deposed leader's write refused"]["detail"]
    assert by_name["no-op job runs in its named pool"]["measured"]["pool"] == "rollout"
    preempt = by_name["higher tier preempts a lower tier's job"]
    assert preempt["status"] == "skip" and "never preempts" in preempt["detail"]
    assert by_name["job over quota waits and says why"]["measured"]["reason"].startswith("Quota: pool train")
    assert by_name["waiting jobs start in priority order"]["measured"] == {"high": "running", "low": "pending"}
    result, jobs = cli.json("job", "list")
    assert result.exit_code == 0 and jobs == []  # every job the stage submitted was cancelled


def test_stage_3_with_kubernetes_and_no_cluster_skips_the_job_checks_saying_what_would_run(cli):
    result, data = cli.json("stage", "run", "3", *FAST_LEASE, "--set", "controlplane.executor=kubernetes")
    report = data["reports"][0]
    skipped = [c for c in report["checks"] if c["status"] == "skip"]
    assert result.exit_code == 0 and report["status"] == "pass"
    assert len(skipped) == 4 and all("would apply" in c["detail"] and "LocalQueue agentrl-rollout" in c["detail"] for c in skipped)
    assert next(c for c in report["checks"] if c["name"] == "Kubernetes and Kueue manifests validate")["status"] == "pass"


def test_stage_3_fails_with_the_fix_when_the_store_is_unreachable(cli, tmp_path):
    (tmp_path / "f").write_text("")
    result, data = cli.json("stage", "run", "3", "--set", f"controlplane.state_store=sqlite:///{tmp_path}/f/state.db")
    first = data["reports"][0]["checks"][0]
    assert result.exit_code == 1 and first["status"] == "fail" and "controlplane.state_store" in first["hint"]
