"""Kubernetes and Kueue manifests for the configured pools, priorities and roles, as plain dicts.

What is rendered, and how the config lands in it:
- a Namespace (`cluster.namespace`); one ServiceAccount per role (controlplane, trainer, inference,
  environment). Only the control plane mounts a token, and only it has a Role: create/read/delete
  Jobs and JobSets, read Kueue Workloads, Pods and their logs, in its own namespace. The others get
  no API rights at all.
- per pool: a ResourceFlavor (nodeLabels = `node_labels`), a ClusterQueue with that flavor's quota
  (cpu = `capacity`, pods = `quota`, accelerators = `accelerators` x `quota`) and preemption of lower
  priorities when `preemptible`, and a LocalQueue `<cluster.kueue_queue>-<pool>`.
- per priority: a WorkloadPriorityClass `agentrl-<name>` with its value.
- the control plane: a Deployment of two `agentrl controlplane serve` replicas reading the config from
  a ConfigMap; a no-op Job per pool (the job template `agentrl job submit` fills in); a JobSet for a
  multi-role training run (trainer x `cluster.nodes` with `cluster.gpus_per_node`, inference, environment).
Credentials never appear: pods read them from Secrets by reference (state-store password, S3 keys).
ClusterQueues, ResourceFlavors and WorkloadPriorityClasses are cluster-scoped, for an administrator to apply.
"""

from __future__ import annotations

import yaml

from agentrl_cli import __version__
from agentrl_cli.config.models import PlatformConfig, PoolConfig
from agentrl_cli.controlplane.executor import JobSpec

KUEUE = "kueue.x-k8s.io/v1beta2"
ROLES = ("controlplane", "trainer", "inference", "environment")
QUEUE_LABEL, PRIORITY_LABEL = "kueue.x-k8s.io/queue-name", "kueue.x-k8s.io/priority-class"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
CONFIG_MAP, STORE_SECRET, S3_SECRET = "agentrl-config", "agentrl-state-store", "agentrl-s3"


def sa_name(role: str) -> str:
    return f"agentrl-{role}"


def queue_name(cfg: PlatformConfig, pool: str) -> str:
    return f"{cfg.cluster.kueue_queue}-{pool}"


def image(cfg: PlatformConfig, role: str) -> str:
    return f"{cfg.cluster.image_registry.rstrip('/')}/{role}:{__version__}"


def _meta(name: str, cfg: PlatformConfig | None = None, labels: dict | None = None) -> dict:
    meta: dict = {"name": name, "labels": {"app.kubernetes.io/part-of": "agentrl", **(labels or {})}}
    if cfg is not None:
        meta["namespace"] = cfg.cluster.namespace
    return meta


def render_all(cfg: PlatformConfig) -> list[dict]:
    docs: list[dict] = [{"apiVersion": "v1", "kind": "Namespace", "metadata": _meta(cfg.cluster.namespace)}]
    docs += [{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(sa_name(r), cfg),
              "automountServiceAccountToken": r == "controlplane"} for r in ROLES]
    docs += _rbac(cfg)
    for pool in cfg.controlplane.pools:
        docs += _pool_objects(cfg, pool)
    docs += [{"apiVersion": KUEUE, "kind": "WorkloadPriorityClass", "metadata": _meta(f"agentrl-{p.name}"), "value": p.value,
              "description": f"agentrl priority class {p.name}"} for p in cfg.controlplane.priorities]
    docs.append(_config_map(cfg))
    docs.append(_controlplane_deployment(cfg))
    for pool in cfg.controlplane.pools:
        spec = JobSpec(job_id=f"noop-{pool.name}", pool=pool.name, priority=cfg.controlplane.priorities[0].name,
                       priority_value=cfg.controlplane.priorities[0].value, command=["sh", "-c", "echo agentrl no-op job"])
        docs.append(render_job(cfg, spec))
    docs.append(_training_jobset(cfg))
    return docs


def to_yaml(docs: list[dict]) -> str:
    return yaml.safe_dump_all(docs, sort_keys=False)


def _rbac(cfg: PlatformConfig) -> list[dict]:
    read = ["get", "list", "watch"]
    rules = [{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create", "delete", *read]},
             {"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"], "verbs": ["create", "delete", *read]},
             {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": read},
             {"apiGroups": [""], "resources": ["pods"], "verbs": read},
             {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]}]
    name = sa_name("controlplane")
    return [{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _meta(name, cfg), "rules": rules},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": _meta(name, cfg),
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
             "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": cfg.cluster.namespace}]}]


def _pool_objects(cfg: PlatformConfig, pool: PoolConfig) -> list[dict]:
    flavor = f"agentrl-{pool.name}"
    resources = [{"name": "cpu", "nominalQuota": pool.capacity}, {"name": "pods", "nominalQuota": pool.quota}]
    if pool.accelerators:
        resources.append({"name": cfg.cluster.accelerator_resource, "nominalQuota": pool.accelerators * pool.quota})
    rf_spec = {"nodeLabels": dict(pool.node_labels)} if pool.node_labels else {}
    return [
        {"apiVersion": KUEUE, "kind": "ResourceFlavor", "metadata": _meta(flavor), "spec": rf_spec},
        {"apiVersion": KUEUE, "kind": "ClusterQueue", "metadata": _meta(flavor, labels={"agentrl/pool": pool.name}),
         "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": cfg.cluster.namespace}},
                  "queueingStrategy": "BestEffortFIFO",
                  "resourceGroups": [{"coveredResources": [r["name"] for r in resources],
                                      "flavors": [{"name": flavor, "resources": resources}]}],
                  "preemption": {"withinClusterQueue": "LowerPriority" if pool.preemptible else "Never"}}},
        {"apiVersion": KUEUE, "kind": "LocalQueue", "metadata": _meta(queue_name(cfg, pool.name), cfg),
         "spec": {"clusterQueue": flavor}},
    ]


def _secret_env(cfg: PlatformConfig, role: str) -> list[dict]:
    def ref(var: str, secret: str, key: str) -> dict:
        return {"name": var, "valueFrom": {"secretKeyRef": {"name": secret, "key": key, "optional": True}}}
    env = []
    if role == "controlplane" and cfg.controlplane.state_store.startswith("postgres"):
        env.append(ref("PGPASSWORD", STORE_SECRET, "password"))
    if role in ("trainer", "environment") and cfg.data.store == "s3":
        env += [ref("AWS_ACCESS_KEY_ID", S3_SECRET, "access_key_id"), ref("AWS_SECRET_ACCESS_KEY", S3_SECRET, "secret_access_key")]
    return env


def _container(cfg: PlatformConfig, role: str, command: list[str], cpus: int, accelerators: int = 0) -> dict:
    limits: dict = {"cpu": str(cpus)}
    if accelerators:
        limits[cfg.cluster.accelerator_resource] = str(accelerators)
    c = {"name": role, "image": image(cfg, role), "command": command,
         "resources": {"requests": {"cpu": str(cpus)}, "limits": limits},
         "securityContext": {"allowPrivilegeEscalation": False, "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}}}
    env = _secret_env(cfg, role)
    if env:
        c["env"] = env
    return c


def _pod_spec(cfg: PlatformConfig, role: str, pool: PoolConfig, container: dict, restart: str = "Never") -> dict:
    container["volumeMounts"] = [{"name": "config", "mountPath": "/etc/agentrl", "readOnly": True}]
    spec: dict = {"serviceAccountName": sa_name(role), "automountServiceAccountToken": role == "controlplane",
                  "restartPolicy": restart, "containers": [container],
                  "volumes": [{"name": "config", "configMap": {"name": CONFIG_MAP}}]}
    if pool.node_labels:
        spec["nodeSelector"] = dict(pool.node_labels)
    if pool.accelerators and cfg.cluster.accelerator_product:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": GPU_PRODUCT_LABEL, "operator": "In", "values": [cfg.cluster.accelerator_product]}]}]}}}
    return spec


def render_job(cfg: PlatformConfig, spec: JobSpec, role: str = "trainer") -> dict:
    """The Job for one submitted job: suspended until Kueue admits it into the pool's LocalQueue."""
    pool = next(p for p in cfg.controlplane.pools if p.name == spec.pool)
    labels = {QUEUE_LABEL: queue_name(cfg, pool.name), PRIORITY_LABEL: f"agentrl-{spec.priority}",
              "agentrl/job-id": spec.job_id, "agentrl/pool": pool.name}
    container = _container(cfg, role, list(spec.command), spec.cpus, pool.accelerators)
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": _meta(f"agentrl-{spec.job_id}".lower()[:63], cfg, labels),
            "spec": {"suspend": True, "backoffLimit": 0, "ttlSecondsAfterFinished": 86400,
                     "template": {"metadata": {"labels": {"agentrl/job-id": spec.job_id}},
                                  "spec": _pod_spec(cfg, role, pool, container)}}}


def _config_map(cfg: PlatformConfig) -> dict:
    data = yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(CONFIG_MAP, cfg), "data": {"agentrl.yaml": data}}


def _controlplane_deployment(cfg: PlatformConfig) -> dict:
    labels = {"app.kubernetes.io/name": "agentrl-controlplane"}
    container = _container(cfg, "controlplane", ["agentrl", "controlplane", "serve", "--config", "/etc/agentrl/agentrl.yaml"], 1)
    container["volumeMounts"] = [{"name": "config", "mountPath": "/etc/agentrl", "readOnly": True}]
    pod = {"serviceAccountName": sa_name("controlplane"), "automountServiceAccountToken": True, "containers": [container],
           "volumes": [{"name": "config", "configMap": {"name": CONFIG_MAP}}]}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta("agentrl-controlplane", cfg, labels),
            "spec": {"replicas": 2, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": {"app.kubernetes.io/part-of": "agentrl", **labels}}, "spec": pod}}}


def _training_jobset(cfg: PlatformConfig) -> dict:
    pools = sorted(cfg.controlplane.pools, key=lambda p: -p.priority)
    top = pools[0]
    top_priority = max(cfg.controlplane.priorities, key=lambda p: p.value).name

    def replicated(role: str, replicas: int, command: list[str], accelerators: int) -> dict:
        container = _container(cfg, role, command, 1, accelerators)
        return {"name": role, "replicas": replicas,
                "template": {"spec": {"backoffLimit": 0, "template": {"spec": _pod_spec(cfg, role, top, container)}}}}

    jobs = [replicated("trainer", cfg.cluster.nodes, ["agentrl", "stage", "run", "8", "--config", "/etc/agentrl/agentrl.yaml"],
                       cfg.cluster.gpus_per_node),
            replicated("inference", 1, ["agentrl", "serve", "inference", "--config", "/etc/agentrl/agentrl.yaml"], top.accelerators),
            replicated("environment", 1, ["agentrl", "serve", "sandbox", "--config", "/etc/agentrl/agentrl.yaml"], 0)]
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": _meta("agentrl-train", cfg, {QUEUE_LABEL: queue_name(cfg, top.name), PRIORITY_LABEL: f"agentrl-{top_priority}"}),
            "spec": {"suspend": True, "replicatedJobs": jobs}}
