"""The runs directory of the rendered training JobSet: the PersistentVolumeClaim cluster.runs_volume_claim is
rendered with its size and class, and the trainer and inference pods mount it writable where the trainer
writes each weight version (found from the config the pods get: the ConfigMap's observe.runs_dir resolved
in the container's workingDir, and the disk transport's own export path); other roles keep their emptyDirs;
with the claim '' the pods get an emptyDir there and `agentrl plan --executor kubernetes` warns."""

from __future__ import annotations

import copy
import math
from pathlib import PurePosixPath

import pytest
import yaml

from agentrl_cli.config.models import PlatformConfig
from agentrl_cli.ops.controlplane.manifests import plan_values, render_all
from agentrl_cli.ops.controlplane.validate import validate_documents
from agentrl_cli.ops.image.names import RUN_GID
from agentrl_cli.weightsync.disk import DiskTransport
from agentrl_cli.weightsync.lora import LoraTransport


def config(**sections) -> PlatformConfig:
    sections.setdefault("cluster", {}).setdefault("namespace", "rl")
    return PlatformConfig.model_validate(sections)


def by(docs, kind):
    return [d for d in docs if d["kind"] == kind]


def jobset_pods(docs) -> dict[str, dict]:
    (jobset,) = by(docs, "JobSet")
    return {rj["name"]: rj["template"]["spec"]["template"]["spec"] for rj in jobset["spec"]["replicatedJobs"]}


def pod_config(docs) -> PlatformConfig:
    """The config a pod reads: the rendered ConfigMap of cluster.namespace."""
    (cm,) = [d for d in by(docs, "ConfigMap") if d["metadata"]["namespace"] == "rl"]
    return PlatformConfig.model_validate(yaml.safe_load(cm["data"]["agentrl.yaml"]))


def volume_at(pod: dict, path: PurePosixPath) -> tuple[dict, dict]:
    """(mount, volume) the file at `path` lands on in `pod`: the deepest mount above it."""
    (container,) = pod["containers"]
    mounts = [m for m in container["volumeMounts"] if path.is_relative_to(m["mountPath"])]
    assert mounts, f"{path} is on no volume (the root file system is read-only)"
    mount = max(mounts, key=lambda m: len(PurePosixPath(m["mountPath"]).parts))
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    return mount, volume


def export_paths(docs, pod: dict) -> list[PurePosixPath]:
    """Where the trainer writes a weight version and every server loads it from, as the pod resolves it:
    observe.runs_dir of its config, relative to the container's workingDir, then <run id>/<loop>/."""
    cfg = pod_config(docs)
    (container,) = pod["containers"]
    run_dir = PurePosixPath(container["workingDir"]) / cfg.observe.runs_dir / "r-0001" / "stage8"
    if cfg.training.lora is None:
        return [PurePosixPath(DiskTransport.from_config(cfg, None, run_dir).root) / "v000001"]
    lora = LoraTransport.from_config(cfg, None, run_dir)
    return [PurePosixPath(lora.root) / "v000001", PurePosixPath(lora.full.root) / "v000001"]


@pytest.mark.parametrize("runs_dir", ["runs", "out/runs", "/srv/agentrl-runs"])
@pytest.mark.parametrize("lora", [None, {"rank": 8}])
def test_trainer_and_inference_share_the_claim_where_the_weights_are_written(runs_dir, lora):
    cfg = config(cluster={"nodes": 2, "runs_volume_claim": "shared-runs"}, observe={"runs_dir": runs_dir},
                 training={"lora": lora, "world_size": 2})
    docs = render_all(cfg)
    assert validate_documents(docs) == []
    (claim,) = by(docs, "PersistentVolumeClaim")
    assert claim["metadata"] == {"name": "shared-runs", "namespace": "rl", "labels": {"app.kubernetes.io/part-of": "agentrl"}}
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    pods = jobset_pods(docs)
    assert set(pods) == {"trainer", "inference"}
    for role, pod in pods.items():
        for path in export_paths(docs, pod):
            mount, volume = volume_at(pod, path)
            assert volume == {"name": mount["name"], "persistentVolumeClaim": {"claimName": "shared-runs"}}, (role, path)
            assert not mount.get("readOnly"), (role, path)
        # the pod's user can write it: it runs in the group the kubelet gives the volume
        ctx = pod["securityContext"]
        assert ctx["fsGroup"] == ctx["runAsGroup"] == RUN_GID and ctx["fsGroupChangePolicy"] == "OnRootMismatch"
    # the checkpoints the trainer ranks share sit on the same claim
    trainer = pods["trainer"]
    ckpt = PurePosixPath(trainer["containers"][0]["workingDir"]) / pod_config(docs).observe.runs_dir / "r-0001" / "stage8" / "checkpoints"
    assert volume_at(trainer, ckpt)[1]["persistentVolumeClaim"] == {"claimName": "shared-runs"}


def test_other_roles_keep_their_emptydirs_and_no_claim():
    docs = render_all(config())
    pods = [d["spec"]["template"]["spec"] for d in docs if d["kind"] in ("Deployment", "StatefulSet", "Job")]
    assert {p["serviceAccountName"] for p in pods} == {f"agentrl-{r}" for r in ("controlplane", "reward", "gateway", "sandbox", "trainer")}
    for pod in pods:
        assert not [v for v in pod["volumes"] if "persistentVolumeClaim" in v], pod["serviceAccountName"]
        assert {"name": "work", "emptyDir": {}} in pod["volumes"]


def test_the_claim_takes_the_configured_size_and_class_or_the_plans():
    docs = render_all(config(cluster={"runs_volume_gb": 250, "storage_class": "cephfs"}))
    (claim,) = by(docs, "PersistentVolumeClaim")
    assert claim["metadata"]["name"] == "agentrl-runs"  # the default claim
    assert claim["spec"] == {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "250G"}},
                             "storageClassName": "cephfs"}
    assert validate_documents(docs) == []

    # 0: what a run keeps there by the plan: (keep_last_checkpoints + 1) checkpoints, three weight exports, 1 GB
    cfg = config(training={"keep_last_checkpoints": 4})
    plan = {**plan_values(cfg), "storage checkpoint size": 12.5, "inference memory per server": 30.0,
            "inference KV cache per server": 16.0}
    (claim,) = by(render_all(cfg, plan=plan), "PersistentVolumeClaim")
    assert claim["spec"]["resources"]["requests"]["storage"] == f"{math.ceil(5 * 12.5 + 3 * (30.0 - 16.0) + 1)}G"
    assert "storageClassName" not in claim["spec"]  # '' = the cluster's default


def test_a_broken_claim_fails_validation_naming_the_field():
    docs = copy.deepcopy(render_all(config()))
    by(docs, "PersistentVolumeClaim")[0]["spec"]["accesModes"] = ["ReadWriteMany"]
    errors = validate_documents(docs)
    assert any("PersistentVolumeClaim/agentrl-runs" in e and "'accesModes' was unexpected" in e for e in errors), errors


def test_without_a_claim_the_pods_get_an_emptydir_and_plan_warns(cli, random_model_dir):
    docs = render_all(config(cluster={"runs_volume_claim": "", "nodes": 2}, training={"world_size": 2}))
    assert not by(docs, "PersistentVolumeClaim") and validate_documents(docs) == []
    for role, pod in jobset_pods(docs).items():
        for path in export_paths(docs, pod):
            assert volume_at(pod, path)[1] == {"name": "runs", "emptyDir": {}}, role
        assert "fsGroupChangePolicy" not in pod["securityContext"]

    base = ("plan", "--executor", "kubernetes", "--set", f"model.path={random_model_dir}", "--set", "cluster.nodes=2",
            "--set", "training.world_size=2")
    result, data = cli.json(*base, "--set", "cluster.runs_volume_claim=")
    assert result.exit_code == 0
    (runs_warning,) = [w for w in data["network"]["warnings"] if "cluster.runs_volume_claim is ''" in w]
    assert all(what in runs_warning for what in ("weight exports", "checkpoints", "trainer ranks' control files"))
    result, data = cli.json(*base)  # the default claim holds those; the model's own path is still named
    assert result.exit_code == 0 and not any("runs_volume_claim is" in w for w in data["network"]["warnings"])
    assert [w for w in data["network"]["warnings"] if str(random_model_dir) in w and "PersistentVolumeClaim agentrl-runs" in w]


def test_a_claim_name_kubernetes_refuses_is_a_config_error(cli):
    result = cli("controlplane", "render", "--set", "cluster.runs_volume_claim=Runs_Volume")
    assert result.exit_code == 2 and "cluster.runs_volume_claim" in result.output and "Traceback" not in result.output
