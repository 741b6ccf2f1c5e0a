"""Offline validation of Kubernetes, Kueue and JobSet manifests against the schemas shipped in
`controlplane/schemas/` (strict: unknown fields fail), plus the cross-object references a schema
cannot see: a LocalQueue names a rendered ClusterQueue, a ClusterQueue's flavors are rendered
ResourceFlavors, a Job's or JobSet's queue and priority-class labels name rendered objects, a
StatefulSet's serviceName names a rendered Service of its namespace (the headless one that gives its
pods their names).
Errors are strings `Kind/name: path: message`; an empty list means valid.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import yaml
from jsonschema import Draft202012Validator

from agentrl_cli.core.errors import UsageError

SCHEMAS = Path(__file__).parent / "schemas"
BY_KIND = {
    ("batch/v1", "Job"): "k8s/job-batch-v1.json",
    ("apps/v1", "Deployment"): "k8s/deployment-apps-v1.json",
    ("apps/v1", "StatefulSet"): "k8s/statefulset-apps-v1.json",
    ("v1", "Namespace"): "k8s/namespace-v1.json",
    ("v1", "Service"): "k8s/service-v1.json",
    ("networking.k8s.io/v1", "NetworkPolicy"): "k8s/networkpolicy-networking-v1.json",
    ("v1", "ServiceAccount"): "k8s/serviceaccount-v1.json",
    ("v1", "Secret"): "k8s/secret-v1.json",
    ("v1", "ConfigMap"): "k8s/configmap-v1.json",
    ("v1", "PersistentVolumeClaim"): "k8s/persistentvolumeclaim-v1.json",
    ("rbac.authorization.k8s.io/v1", "Role"): "k8s/role-rbac-v1.json",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "k8s/rolebinding-rbac-v1.json",
    ("kueue.x-k8s.io/v1beta2", "ClusterQueue"): "kueue/clusterqueue.json",
    ("kueue.x-k8s.io/v1beta2", "LocalQueue"): "kueue/localqueue.json",
    ("kueue.x-k8s.io/v1beta2", "ResourceFlavor"): "kueue/resourceflavor.json",
    ("kueue.x-k8s.io/v1beta2", "WorkloadPriorityClass"): "kueue/workloadpriorityclass.json",
    ("jobset.x-k8s.io/v1alpha2", "JobSet"): "jobset/jobset.json",
}
QUEUE_LABEL, PRIORITY_LABEL = "kueue.x-k8s.io/queue-name", "kueue.x-k8s.io/priority-class"


@lru_cache(maxsize=None)
def _validator(rel: str) -> Draft202012Validator:
    return Draft202012Validator(json.loads((SCHEMAS / rel).read_text(encoding="utf-8")))


def _label(doc: dict) -> str:
    meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    return f"{doc.get('kind', '?')}/{meta.get('name', '?')}"


def validate_document(doc: object) -> list[str]:
    if not isinstance(doc, dict):
        return [f"a manifest must be a mapping, got {type(doc).__name__}"]
    key = (doc.get("apiVersion"), doc.get("kind"))
    rel = BY_KIND.get(key)
    if rel is None:
        known = ", ".join(f"{k} {v}" for v, k in BY_KIND)
        return [f"{_label(doc)}: no schema for apiVersion {key[0]!r} kind {key[1]!r} (known: {known})"]
    errors = sorted(_validator(rel).iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))
    return [f"{_label(doc)}: {'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in errors]


def validate_documents(docs: list) -> list[str]:
    errors = [err for doc in docs for err in validate_document(doc)]
    return errors + _references([d for d in docs if isinstance(d, dict)])


def _references(docs: list[dict]) -> list[str]:
    def names(kind: str) -> set[str]:
        return {d.get("metadata", {}).get("name") for d in docs if d.get("kind") == kind}

    cqs, flavors, lqs, wpcs = names("ClusterQueue"), names("ResourceFlavor"), names("LocalQueue"), names("WorkloadPriorityClass")
    services = {((d.get("metadata") or {}).get("namespace"), (d.get("metadata") or {}).get("name")) for d in docs
                if d.get("kind") == "Service"}
    errors = []
    for d in docs:
        kind, spec, labels = d.get("kind"), d.get("spec") or {}, (d.get("metadata") or {}).get("labels") or {}
        if kind == "LocalQueue" and spec.get("clusterQueue") not in cqs:
            errors.append(f"{_label(d)}: spec/clusterQueue: {spec.get('clusterQueue')!r} is not a rendered ClusterQueue")
        if kind == "ClusterQueue":
            for group in spec.get("resourceGroups") or []:
                for flavor in group.get("flavors") or []:
                    if flavor.get("name") not in flavors:
                        errors.append(f"{_label(d)}: flavor {flavor.get('name')!r} is not a rendered ResourceFlavor")
        if kind == "StatefulSet" and ((d.get("metadata") or {}).get("namespace"), spec.get("serviceName")) not in services:
            errors.append(f"{_label(d)}: spec/serviceName: {spec.get('serviceName')!r} is not a rendered Service of its namespace")
        if kind in ("Job", "JobSet"):
            if QUEUE_LABEL in labels and labels[QUEUE_LABEL] not in lqs:
                errors.append(f"{_label(d)}: label {QUEUE_LABEL}={labels[QUEUE_LABEL]!r} names no rendered LocalQueue")
            if PRIORITY_LABEL in labels and labels[PRIORITY_LABEL] not in wpcs:
                errors.append(f"{_label(d)}: label {PRIORITY_LABEL}={labels[PRIORITY_LABEL]!r} names no rendered WorkloadPriorityClass")
    return errors


def load_manifest_files(paths: list[Path]) -> list[dict]:
    """Read YAML files (several documents each); a file that is not YAML is a usage error naming it."""
    docs: list = []
    for path in paths:
        try:
            docs += [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            raise UsageError(f"{path} is not valid YAML{where}: {getattr(exc, 'problem', None) or exc}",
                             "fix the file, or render it again with `agentrl controlplane render --out DIR`") from None
        except OSError as exc:
            raise UsageError(f"cannot read {path}: {exc.strerror}", "check the path") from None
    return docs
