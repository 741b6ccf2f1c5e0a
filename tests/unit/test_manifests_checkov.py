"""The rendered manifests as a third party reads them: checkov's Kubernetes checks pass on the manifests
for two pools and two priorities (once plain, once with every secret and an egress allowlist), except
the checks agentrl_cli/ops/controlplane/checkov_skips.yaml lists with their reasons; a manifest broken on
purpose fails them; they still validate against the schemas; every image they name is one that
`agentrl image build` tags from the same lock.

checkov pins versions of boto3, packaging and networkx that conflict with agentrl's own, so it runs
from a virtual environment of its own: $AGENTRL_CHECKOV (a checkov executable), else checkov in this
interpreter, else CHECKOV_VENV, created with pip on first use.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agentrl_cli.config.models import PlatformConfig
from agentrl_cli.ops.controlplane.manifests import render_all
from agentrl_cli.ops.controlplane.validate import validate_documents
from agentrl_cli.ops.image.lock import build_lock
from agentrl_cli.ops.image.names import workload_images
from agentrl_cli.ops.image.render import render

ROOT = Path(__file__).resolve().parents[2]
SKIPS_FILE = ROOT / "agentrl_cli" / "ops" / "controlplane" / "checkov_skips.yaml"
CHECKOV_VERSION = "3.3.30"
CHECKOV_VENV = Path.home() / ".cache" / "agentrl" / f"checkov-{CHECKOV_VERSION}"
POOLS = {"pools": [{"name": "rollout", "capacity": 8, "quota": 4, "priority": 1, "preemptible": True,
                    "node_labels": {"agentrl/pool": "rollout"}},
                   {"name": "train", "capacity": 64, "quota": 2, "priority": 10, "accelerators": 8,
                    "node_labels": {"agentrl/pool": "train"}}],
         "priorities": [{"name": "low", "value": 100}, {"name": "high", "value": 1000}]}
CLUSTER = {"nodes": 2, "gpus_per_node": 8, "accelerator_product": "NVIDIA-H100-80GB-HBM3"}


def checkov_command() -> list[str]:
    if os.environ.get("AGENTRL_CHECKOV"):
        return [os.environ["AGENTRL_CHECKOV"]]
    try:
        import checkov  # noqa: F401
        return [sys.executable, "-m", "checkov.main"]
    except ImportError:
        pass
    exe = CHECKOV_VENV / "bin" / "checkov"
    if not exe.exists():
        try:
            subprocess.run([sys.executable, "-m", "venv", str(CHECKOV_VENV)], check=True, capture_output=True, timeout=120)
            subprocess.run([str(CHECKOV_VENV / "bin" / "python"), "-m", "pip", "install", "-q", f"checkov=={CHECKOV_VERSION}"],
                           check=True, capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.SubprocessError) as exc:
            detail = getattr(exc, "stderr", "") or str(exc)
            pytest.skip(f"checkov is not importable and could not be installed into {CHECKOV_VENV}: {detail.strip()[-400:]}")
    return [str(exe)]


def configs() -> dict[str, PlatformConfig]:
    secured = {"inference": {"api_key": "sk-planted-in-the-config"},
               "controlplane": {**POOLS, "state_store": "postgresql://agentrl:pw-in-url@db:5432/agentrl"},
               "data": {"store": "s3", "s3": {"endpoint_url": "http://minio.storage:9000"}},
               "harnesses": [{"name": "tool_api_like", "network": "allowlist", "allowlist": ["127.0.0.1:8080", "api.internal:8443"]}],
               "cluster": {**CLUSTER, "namespace": "rl-secured"}}
    return {"plain": PlatformConfig.model_validate({"controlplane": POOLS, "cluster": {**CLUSTER, "namespace": "rl"}}),
            "secured": PlatformConfig.model_validate(secured)}


def pod_templates_as_jobs(docs: list[dict]) -> list[dict]:
    """checkov reads no JobSet: each replicated job's pod template as a plain Job, so every pod spec is checked."""
    out = []
    for js in (d for d in docs if d["kind"] == "JobSet"):
        for rj in js["spec"]["replicatedJobs"]:
            meta = {"name": f"{js['metadata']['name']}-{rj['name']}", "namespace": js["metadata"]["namespace"]}
            out.append({"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": rj["template"]["spec"]})
    return out


def images_named(node) -> set[str]:
    if isinstance(node, dict):
        found = {c["image"] for c in node.get("containers", []) if isinstance(c, dict) and "image" in c}
        return found.union(*(images_named(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(images_named(v) for v in node))
    return set()


def broken_copy(docs: list[dict]) -> dict:
    """The gateway Deployment, renamed, running as root with a writable root and a token."""
    dep = copy.deepcopy(next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "agentrl-gateway"))
    dep["metadata"]["name"] = "agentrl-gateway-broken"
    pod = dep["spec"]["template"]["spec"]
    pod["automountServiceAccountToken"] = True
    ctx = pod["containers"][0]["securityContext"]
    ctx.update(readOnlyRootFilesystem=False, runAsNonRoot=False, runAsUser=0, allowPrivilegeEscalation=True)
    return dep


def test_rendered_manifests_pass_checkov_validate_and_name_only_built_images(tmp_path):
    skips = yaml.safe_load(SKIPS_FILE.read_text())["skips"]
    assert all(s.get("reason", "").strip() and s["id"].startswith("CKV") for s in skips), "every skip needs an id and a reason"
    everywhere = [s["id"] for s in skips if not s.get("resources")]
    scoped = {(s["id"], r) for s in skips for r in s.get("resources", [])}

    lock = build_lock(PlatformConfig().image)
    written: dict[str, str] = {}  # checkov resource id -> which config
    for name, cfg in configs().items():
        built = render(lock, tmp_path / f"context-{name}", cfg.cluster.image_registry, cfg.cluster.base_image)
        docs = render_all(cfg, images=workload_images(lock, cfg.cluster.image_registry))
        assert validate_documents(docs) == []
        named = images_named(docs)
        assert named and named <= {img["tag"] for img in built["images"] if img["role"] != "base"}, named
        text = yaml.safe_dump_all(docs)
        assert "sk-planted-in-the-config" not in text and "pw-in-url" not in text and "**********" not in text
        out = tmp_path / "manifests" / name
        out.mkdir(parents=True)
        for n, doc in enumerate(docs + pod_templates_as_jobs(docs)):
            (out / f"{n:02d}-{doc['kind'].lower()}-{doc['metadata']['name']}.yaml").write_text(yaml.safe_dump(doc))
            if doc["kind"] in ("Deployment", "StatefulSet", "Job"):
                written[f"{doc['kind']}.{doc['metadata']['namespace']}.{doc['metadata']['name']}"] = name
    broken = broken_copy(docs)
    (tmp_path / "manifests" / "broken.yaml").write_text(yaml.safe_dump(broken))

    proc = subprocess.run([*checkov_command(), "-d", str(tmp_path / "manifests"), "--framework", "kubernetes", "-o", "json",
                           "--skip-download", "--skip-check", ",".join(everywhere)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]  # 1: some check failed (the broken copy's at least)
    report = json.loads(proc.stdout)
    report = report[0] if isinstance(report, list) else report
    summary, results = report["summary"], report["results"]
    assert summary["parsing_errors"] == 0

    def key(check: dict) -> tuple[str, str]:  # checkov names a resource Kind.namespace.name
        parts = check["resource"].split(".")
        return check["check_id"], f"{parts[0]}/{parts[-1]}"

    broken_id = f"Deployment.{broken['metadata']['namespace']}.agentrl-gateway-broken"
    failed = [c for c in results["failed_checks"] if c["resource"] != broken_id]
    unexpected = [f"{c['check_id']} {c['check_name']}: {c['resource']}" for c in failed if key(c) not in scoped]
    assert not unexpected, "checkov checks failed that checkov_skips.yaml does not justify:\n" + "\n".join(unexpected)
    assert {key(c) for c in failed} == scoped, "a scoped skip in checkov_skips.yaml no longer fails: remove it"
    assert not {c["check_id"] for c in results["failed_checks"] + results["passed_checks"]} & set(everywhere)
    checked = {c["resource"] for c in results["passed_checks"]}
    assert set(written) <= checked, f"checkov did not check {sorted(set(written) - checked)}"
    # the checks can fail: the copy running as root, writable, escalating and with a token fails exactly those
    broken_fails = {c["check_id"] for c in results["failed_checks"] if c["resource"] == broken_id}
    assert {"CKV_K8S_22", "CKV_K8S_23", "CKV_K8S_20", "CKV_K8S_38"} <= broken_fails, broken_fails
    print(f"checkov {summary.get('checkov_version')}: {summary['passed']} passed, {summary['failed']} failed "
          f"({len(results['failed_checks']) - len(broken_fails)} justified, {len(broken_fails)} on the broken copy), "
          f"{len(everywhere)} skipped everywhere ({', '.join(everywhere)}), {summary['resource_count']} resources")
