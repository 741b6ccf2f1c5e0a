"""Kubernetes and Kueue manifests for the configured pools, priorities and roles, as plain dicts, in a
form that runs as rendered.

What is rendered, and how the config lands in it:
- Namespaces: `cluster.namespace` enforcing the restricted Pod Security Standard, and
  `<namespace>-sandbox` for the sandbox service (see "The sandbox" below).
- one ServiceAccount per role (controlplane, trainer, inference, gateway, reward, sandbox). Only the
  control plane mounts a token, and only it has a Role: create/read/delete Jobs and JobSets, read
  Kueue Workloads, Pods and their logs, in its own namespace. The others get no API rights at all.
- per pool: a ResourceFlavor (nodeLabels = `node_labels`), a ClusterQueue with that flavor's quota
  (cpu = `capacity`, pods = `quota`, accelerators = `accelerators` x `quota`) and preemption of lower
  priorities when `preemptible`, and a LocalQueue `<cluster.kueue_queue>-<pool>`.
- per priority: a WorkloadPriorityClass `agentrl-<name>` with its value.
- workloads, each from the image `agentrl image build` tags for its role (`ops/image/names.py`): the
  control plane (a Deployment, two replicas on PostgreSQL, one on SQLite, which cannot be shared), the
  reward service and the gateway (Deployments), the sandbox service (a StatefulSet, see "The sandbox
  replicas"), a no-op Job per pool (the
  template `agentrl job submit` fills in) and a JobSet for a training run (trainer x `cluster.nodes`
  with `cluster.gpus_per_node`, inference x `inference.replicas`). Every server gets a Service, binds
  0.0.0.0 by an explicit `--host` (the config's `*.host` stays loopback for one box), and is probed
  on its GET /health. The ConfigMap holds the config with the in-cluster addresses filled in where
  the config names none (inference.urls: each inference pod's JobSet hostname, so weight sync reaches
  every server; reward and sandbox service_url: their Services; sandbox.replica_url: each sandbox
  replica by its pod name) and no secret at all.
- resources (requests = limits): trainer: `agentrl plan`'s training memory per rank x ranks per node
  + 1 GiB, a core per rank (x training.cpu_threads when set); inference: the plan's memory per server
  + 1 GiB, inference.cpu_threads cores (at least one); sandbox: the plan's environment cores and memory
  split over its environment hosts (the StatefulSet's replicas); reward, gateway and control plane the
  fixed `SERVICE_RESOURCES`; a submitted Job its `--cpus` and `JOB_MEMORY_PER_CPU` per core.
- NetworkPolicies (`networkpolicies.py`): default deny, then the east-west allowlist the roles need.
- the PersistentVolumeClaim `cluster.runs_volume_claim` for the runs directory (see "The runs directory").
Secrets never appear: each is a Kubernetes Secret the operator creates, mounted read-only as a file
under /var/run/secrets/agentrl/ and named to the process by an environment variable holding the
path (AGENTRL_INFERENCE__API_KEY_FILE, AGENTRL_PGPASSWORD_FILE, AWS_SHARED_CREDENTIALS_FILE).
Pods follow the restricted Pod Security Standard: non-root UID/GID of the images, no privilege
escalation, every capability dropped, RuntimeDefault seccomp, a read-only root file system with
emptyDirs for /tmp, HOME and the working directory.
The runs directory: the JobSet's trainer and inference pods mount the PersistentVolumeClaim
`cluster.runs_volume_claim` (rendered here: ReadWriteMany, `cluster.runs_volume_gb` or the size
`runs_volume_gb` derives from the plan, `cluster.storage_class`) writable at observe.runs_dir as the
pods resolve it (`netplan.in_pod`: relative to the working directory), because the trainer exports
each weight version under runs/<run id>/<loop>/weights for every inference pod to load by that path,
and several trainer pods share their checkpoints and rank files there. The pods' fsGroup (the images'
GID, with fsGroupChangePolicy OnRootMismatch) makes the volume theirs where the storage applies
fsGroup; storage that does not (NFS exports) must be writable by RUN_UID or RUN_GID. With the claim ''
they mount an emptyDir there instead (nothing shared, nothing kept past the pod; `agentrl plan
--executor kubernetes` warns). Other pods keep runs/ on their working directory's emptyDir.
The sandbox: bubblewrap builds user, pid, mount and network namespaces and mounts a fresh /proc,
which RuntimeDefault seccomp (unshare/mount) and the masked /proc of a container refuse. Its pods
therefore run in their own namespace labelled privileged, in a user namespace of their own
(hostUsers: false, Kubernetes >= 1.33 with a runtime that supports it), with procMount Unmasked and
seccomp/AppArmor Unconfined, and otherwise the restricted settings (non-root, no escalation, no
capabilities, read-only root); every command inside still runs under agentrl's own seccomp filter.
The sandbox replicas: each keeps its sandboxes in memory, so a sandbox's calls must reach the replica
that created it. They run as a StatefulSet with the headless Service `agentrl-sandbox-headless`, which
gives each pod a stable name (<pod>.agentrl-sandbox-headless.<namespace>-sandbox.svc); each pod serves
with sandbox.replica = its pod name (downward API), which it puts in its sandboxes' ids and answers,
and the clients' sandbox.replica_url names a replica that way. Creation goes to the Service
`agentrl-sandbox` (any replica); a replica that died or restarted loses its sandboxes, whose episodes
end `infra_error` (masked, `sandbox_lost`).
The sandbox images: when a harness has an image (harnesses[].image), its digest is read at render
(harnesses[].image_digest when pinned, else from the image here: exit 2 when neither can be had),
written into the ConfigMap's harnesses[].image_digest (so clients ask the service for that digest
and need no copy of the image) and named on the sandbox pods' template (annotation
`IMAGES_ANNOTATION`: harness -> digest). The sandbox pods mount the PersistentVolumeClaim
`IMAGES_CLAIM` read-only at sandbox.image_cache_dir: the image cache, filled beforehand with
`agentrl image unpack` (docs/environments.md); a replica runs an image only from there, by digest,
and refuses a digest the volume does not hold. The claim is the operator's, not rendered: its
storage (a ReadOnlyMany class, NFS, a pre-provisioned volume) is the cluster's choice.
ClusterQueues, ResourceFlavors and WorkloadPriorityClasses are cluster-scoped, for an administrator to apply.
"""

from __future__ import annotations

import math
import re

import yaml

from agentrl_cli.config.models import PlatformConfig, PoolConfig
from agentrl_cli.ops.controlplane.executor import JobSpec
from agentrl_cli.ops.controlplane.k8s_names import (  # noqa: F401 - callers also read these from here
    KUEUE, ROLES, SERVERS, PORTS, HEALTH_PATH, QUEUE_LABEL, PRIORITY_LABEL, COMPONENT, PART_OF,
    GPU_PRODUCT_LABEL, CONFIG_MAP, CONFIG_PATH, SECRETS_DIR, JOBSET, GI, SERVICE_RESOURCES, RUNTIME_MEMORY,
    JOB_MEMORY_PER_CPU, SANDBOX_HEADLESS, sa_name, queue_name, sandbox_namespace, namespace_of, port_of, service_url,
    sandbox_replica_url, inference_urls, _meta)
from agentrl_cli.ops.image.names import HOME, RUN_GID, RUN_UID, WORKDIR, config_images
from agentrl_cli.ops.netplan import in_pod

RUNS_VOLUME = "runs"
IMAGES_CLAIM = "agentrl-images"  # the sandbox pods' image cache, filled by `agentrl image unpack`
IMAGES_ANNOTATION = "agentrl/image-digests"
WEIGHT_EXPORTS_KEPT = 3  # weightsync/disk.py keeps the newest 2; the next one is written before the oldest goes


def render_all(cfg: PlatformConfig, images: dict[str, str] | None = None, plan: dict[str, float] | None = None) -> list[dict]:
    """Every object, in apply order. `images`: workload -> tag (default: the config's lock, see
    ops/image/names.py); `plan`: `agentrl plan` item -> value (default: computed from the config)."""
    from agentrl_cli.ops.controlplane.networkpolicies import network_policies

    images = images if images is not None else config_images(cfg)
    plan = plan if plan is not None else plan_values(cfg)
    cfg = pin_harness_images(cfg)
    docs: list[dict] = _namespaces(cfg)
    docs += [{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(sa_name(r), namespace_of(cfg, r)),
              "automountServiceAccountToken": r == "controlplane"} for r in ROLES]
    docs += _rbac(cfg)
    for pool in cfg.controlplane.pools:
        docs += _pool_objects(cfg, pool)
    docs += [{"apiVersion": KUEUE, "kind": "WorkloadPriorityClass", "metadata": _meta(f"agentrl-{p.name}"), "value": p.value,
              "description": f"agentrl priority class {p.name}"} for p in cfg.controlplane.priorities]
    docs += [_config_map(cfg, ns) for ns in (cfg.cluster.namespace, sandbox_namespace(cfg))]
    docs += _runs_claim(cfg, plan)
    docs += network_policies(cfg)
    docs += [_service(cfg, role) for role in SERVERS]
    docs.append(_headless_service(cfg, "sandbox", SANDBOX_HEADLESS))
    docs.append(_controlplane_deployment(cfg, images))
    docs += [_server_deployment(cfg, images, role) for role in ("reward", "gateway")]
    docs.append(_sandbox_statefulset(cfg, images, plan))
    for pool in cfg.controlplane.pools:
        spec = JobSpec(job_id=f"noop-{pool.name}", pool=pool.name, priority=cfg.controlplane.priorities[0].name,
                       priority_value=cfg.controlplane.priorities[0].value, command=["sh", "-c", "echo agentrl no-op job"])
        docs.append(render_job(cfg, spec, images=images))
    docs.append(_training_jobset(cfg, images, plan))
    return docs


def pin_harness_images(cfg: PlatformConfig) -> PlatformConfig:
    """`cfg` with each harness image's digest filled in (harnesses[].image_digest, else read from the
    image here); ImageError (exit 2) naming the image when it has neither."""
    if not any(h.image and not h.image_digest for h in cfg.harnesses):
        return cfg
    from agentrl_cli.envs.images import ImageError, digest_of

    pinned = cfg.model_copy(deep=True)
    for h in pinned.harnesses:
        if h.image and not h.image_digest:
            try:
                h.image_digest = digest_of(h.image)
            except ImageError as exc:
                raise ImageError(h.image, f"harness {h.name!r}: the manifests must name its digest, and {exc.reason}",
                                 f"set harnesses[{h.name}].image_digest, or render where the image is") from None
    return pinned


def image_digests(cfg: PlatformConfig) -> dict[str, str]:
    """harness -> the digest of its image (harnesses with one, pinned)."""
    return {h.name: h.image_digest for h in cfg.harnesses if h.image}


def to_yaml(docs: list[dict]) -> str:
    return yaml.safe_dump_all(docs, sort_keys=False)


def plan_values(cfg: PlatformConfig) -> dict[str, float]:
    """`agentrl plan`'s lines for this config (default inputs), "<area> <item>" -> value."""
    from agentrl_cli.ops.plan import PlanInputs, build_plan, model_shape

    return {f"{ln.area} {ln.item}": ln.value for ln in build_plan(cfg, model_shape(cfg.model), PlanInputs())}


def runs_volume_gb(cfg: PlatformConfig, plan: dict[str, float]) -> int:
    """cluster.runs_volume_gb, or when 0 what a run keeps there by `agentrl plan`: (keep_last_checkpoints
    + 1 being written) checkpoints, WEIGHT_EXPORTS_KEPT weight exports (the model's weights: the plan's
    memory per server less its KV cache) and 1 GB for reports, metrics and adapters, in whole GB."""
    if cfg.cluster.runs_volume_gb:
        return cfg.cluster.runs_volume_gb
    checkpoints = (cfg.training.keep_last_checkpoints + 1) * plan["storage checkpoint size"]
    weights = plan["inference memory per server"] - plan["inference KV cache per server"]
    return math.ceil(checkpoints + WEIGHT_EXPORTS_KEPT * weights + 1)


def _runs_claim(cfg: PlatformConfig, plan: dict[str, float]) -> list[dict]:
    c = cfg.cluster
    if not c.runs_volume_claim:
        return []
    spec: dict = {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": f"{runs_volume_gb(cfg, plan)}G"}}}
    if c.storage_class:
        spec["storageClassName"] = c.storage_class
    return [{"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": _meta(c.runs_volume_claim, c.namespace), "spec": spec}]


def _mount_runs(cfg: PlatformConfig, pod: dict) -> None:
    """Mount the runs volume (the claim, or an emptyDir with none) writable at observe.runs_dir in `pod`,
    in place of a volume mounted at that same path."""
    path, claim = in_pod(cfg.observe.runs_dir), cfg.cluster.runs_volume_claim
    (container,) = pod["containers"]
    replaced = {m["name"] for m in container["volumeMounts"] if m["mountPath"] == path}
    container["volumeMounts"] = [m for m in container["volumeMounts"] if m["name"] not in replaced]
    container["volumeMounts"].append({"name": RUNS_VOLUME, "mountPath": path})
    pod["volumes"] = [v for v in pod["volumes"] if v["name"] not in replaced]
    pod["volumes"].append({"name": RUNS_VOLUME, **({"persistentVolumeClaim": {"claimName": claim}} if claim else {"emptyDir": {}})})
    if claim:  # the kubelet chowns a volume to fsGroup; a volume of checkpoints only when its root is not yet
        pod["securityContext"]["fsGroupChangePolicy"] = "OnRootMismatch"


def _namespaces(cfg: PlatformConfig) -> list[dict]:
    def ns(name: str, level: str, why: str) -> dict:
        meta = _meta(name, labels={f"pod-security.kubernetes.io/{mode}": level for mode in ("enforce", "audit", "warn")})
        meta["labels"]["pod-security.kubernetes.io/enforce-version"] = "latest"
        meta["annotations"] = {"agentrl/pod-security": why}
        return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}

    return [ns(cfg.cluster.namespace, "restricted", "every agentrl pod here meets the restricted Pod Security Standard"),
            ns(sandbox_namespace(cfg), "privileged",
               "the sandbox service alone: bubblewrap creates user, pid, mount and network namespaces and mounts a fresh "
               "/proc, which RuntimeDefault seccomp and a masked /proc refuse, so its pods set seccomp and AppArmor "
               "Unconfined and procMount Unmasked in a user namespace of their own (hostUsers: false), non-root, "
               "without privilege escalation or capabilities; each sandboxed command runs under agentrl's seccomp filter")]


def _rbac(cfg: PlatformConfig) -> list[dict]:
    read = ["get", "list", "watch"]
    rules = [{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create", "delete", *read]},
             {"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"], "verbs": ["create", "delete", *read]},
             {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": read},
             {"apiGroups": [""], "resources": ["pods"], "verbs": read},
             {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]}]
    name, ns = sa_name("controlplane"), cfg.cluster.namespace
    return [{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _meta(name, ns), "rules": rules},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": _meta(name, ns),
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
             "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}]}]


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
        {"apiVersion": KUEUE, "kind": "LocalQueue", "metadata": _meta(queue_name(cfg, pool.name), cfg.cluster.namespace),
         "spec": {"clusterQueue": flavor}},
    ]


def cluster_config(cfg: PlatformConfig) -> dict:
    """The config the pods read: no secret (each comes from its mounted Secret), and the in-cluster
    addresses of the servers where the config names none."""
    from agentrl_cli.config.load import secret_keys

    data = cfg.model_dump(mode="json")
    for section, key in secret_keys():
        data[section][key] = None
    store = data["controlplane"]["state_store"]
    data["controlplane"]["state_store"] = re.sub(r"^(\w+://[^:/@]+):[^@/]*@", r"\1@", store)  # a password in the URL
    if not data["inference"]["urls"]:
        data["inference"]["urls"] = inference_urls(cfg)
    for section in ("reward", "sandbox"):
        if not data[section]["service_url"]:
            data[section]["service_url"] = service_url(cfg, section)
            if section == "sandbox" and not data[section]["replica_url"]:  # the rendered StatefulSet's replicas
                data[section]["replica_url"] = sandbox_replica_url(cfg)
    return data


def _config_map(cfg: PlatformConfig, namespace: str) -> dict:
    data = yaml.safe_dump(cluster_config(cfg), sort_keys=False)
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(CONFIG_MAP, namespace), "data": {"agentrl.yaml": data}}


# the bearer keys of the services (security/keys.py): section -> the roles that serve or call it
SERVICE_KEY_MOUNTS = {"reward": ("reward", "trainer"), "sandbox": ("sandbox", "trainer", "reward"),
                      "gateway": ("gateway", "trainer"), "controlplane": ("controlplane",)}


def _secret_files(cfg: PlatformConfig, role: str) -> list[tuple[str, str, str]]:
    """(Secret name, key, environment variable naming the mounted file) a role needs."""
    out = []
    if cfg.inference.api_key is not None and role in ("inference", "trainer", "gateway"):
        out.append(("agentrl-inference-api-key", "api_key", "AGENTRL_INFERENCE__API_KEY_FILE"))
    for section, roles in SERVICE_KEY_MOUNTS.items():
        # the sandbox service binds every interface in a pod and refuses to start without a key
        if role in roles and (section == "sandbox" or getattr(cfg, section).api_key is not None):
            out.append((f"agentrl-{section}-api-key", "api_key", f"AGENTRL_{section.upper()}__API_KEY_FILE"))
    if role == "controlplane" and cfg.controlplane.state_store.startswith("postgres"):
        from agentrl_cli.ops.controlplane.store import PASSWORD_FILE_ENV

        out.append(("agentrl-state-store", "password", PASSWORD_FILE_ENV))
    if role == "trainer" and cfg.data.store == "s3":
        out.append(("agentrl-s3", "credentials", "AWS_SHARED_CREDENTIALS_FILE"))  # an AWS shared-credentials file
    return out


def _cpu(cores: float) -> str:
    return str(int(cores)) if float(cores).is_integer() else f"{math.ceil(cores * 1000)}m"


def _memory(nbytes: float) -> str:
    return f"{math.ceil(nbytes / 2**20)}Mi"


def _security(role: str) -> tuple[dict, dict]:
    """(pod securityContext, container securityContext)."""
    seccomp = {"type": "Unconfined" if role == "sandbox" else "RuntimeDefault"}
    pod = {"runAsNonRoot": True, "runAsUser": RUN_UID, "runAsGroup": RUN_GID, "fsGroup": RUN_GID, "seccompProfile": seccomp}
    container = {"allowPrivilegeEscalation": False, "privileged": False, "capabilities": {"drop": ["ALL"]},
                 "readOnlyRootFilesystem": True, "runAsNonRoot": True, "runAsUser": RUN_UID, "runAsGroup": RUN_GID,
                 "seccompProfile": seccomp}
    if role == "sandbox":
        pod["appArmorProfile"] = container["appArmorProfile"] = {"type": "Unconfined"}
        container["procMount"] = "Unmasked"
    return pod, container


def _container(cfg: PlatformConfig, images: dict[str, str], role: str, command: list[str], cpus: float, memory: float,
               accelerators: int = 0) -> dict:
    limits: dict = {"cpu": _cpu(cpus), "memory": _memory(memory)}
    if accelerators:
        limits[cfg.cluster.accelerator_resource] = str(accelerators)
    mounts = [{"name": "config", "mountPath": "/etc/agentrl", "readOnly": True},
              {"name": "tmp", "mountPath": "/tmp"}, {"name": "home", "mountPath": HOME}, {"name": "work", "mountPath": WORKDIR}]
    env = []
    for secret, key, var in _secret_files(cfg, role):
        mounts.append({"name": secret, "mountPath": f"{SECRETS_DIR}/{secret}", "readOnly": True})
        env.append({"name": var, "value": f"{SECRETS_DIR}/{secret}/{key}"})
    c: dict = {"name": role, "image": images[role], "imagePullPolicy": "Always", "command": command, "workingDir": WORKDIR,
               "resources": {"requests": {k: v for k, v in limits.items()}, "limits": limits},
               "securityContext": _security(role)[1], "volumeMounts": mounts}
    if env:
        c["env"] = env
    if role in SERVERS:
        port = port_of(cfg, role)
        c["ports"] = [{"name": "http", "containerPort": port, "protocol": "TCP"}]
        probe = {"httpGet": {"path": HEALTH_PATH, "port": "http"}, "periodSeconds": 10, "timeoutSeconds": 5}
        c["readinessProbe"] = {**probe, "failureThreshold": 3}
        c["livenessProbe"] = {**probe, "failureThreshold": 6}
        if role == "inference":  # loading the model may take inference.startup_timeout_s
            c["startupProbe"] = {**probe, "failureThreshold": max(1, math.ceil(cfg.inference.startup_timeout_s / 10))}
    return c


def _pod_spec(cfg: PlatformConfig, role: str, container: dict, pool: PoolConfig | None = None,
              restart: str | None = None) -> dict:
    volumes: list[dict] = [{"name": "config", "configMap": {"name": CONFIG_MAP, "defaultMode": 0o440}},
                           {"name": "tmp", "emptyDir": {"sizeLimit": _memory(_tmp_bytes(cfg, role))}},
                           {"name": "home", "emptyDir": {}}, {"name": "work", "emptyDir": {}}]
    volumes += [{"name": secret, "secret": {"secretName": secret, "defaultMode": 0o440, "items": [{"key": key, "path": key}]}}
                for secret, key, _ in _secret_files(cfg, role)]
    spec: dict = {"serviceAccountName": sa_name(role), "automountServiceAccountToken": role == "controlplane",
                  "securityContext": _security(role)[0], "containers": [container], "volumes": volumes}
    if role == "sandbox":
        spec["hostUsers"] = False
    if restart:
        spec["restartPolicy"] = restart
    if pool is not None and pool.node_labels:
        spec["nodeSelector"] = dict(pool.node_labels)
    if pool is not None and pool.accelerators and cfg.cluster.accelerator_product:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": GPU_PRODUCT_LABEL, "operator": "In", "values": [cfg.cluster.accelerator_product]}]}]}}}
    return spec


def _tmp_bytes(cfg: PlatformConfig, role: str) -> int:
    if role == "sandbox":  # the sandboxes' work directories and /tmp live under sandbox.root_dir in /tmp
        s = cfg.sandbox
        return s.max_concurrency * (s.workdir_size_mb + s.tmpfs_size_mb) * 2**20 + GI
    return GI


def _template_labels(role: str) -> dict:
    return {PART_OF: "agentrl", COMPONENT: role}


def render_job(cfg: PlatformConfig, spec: JobSpec, role: str = "trainer", images: dict[str, str] | None = None) -> dict:
    """The Job for one submitted job: suspended until Kueue admits it into the pool's LocalQueue."""
    images = images if images is not None else config_images(cfg)
    pool = next(p for p in cfg.controlplane.pools if p.name == spec.pool)
    labels = {QUEUE_LABEL: queue_name(cfg, pool.name), PRIORITY_LABEL: f"agentrl-{spec.priority}",
              "agentrl/job-id": spec.job_id, "agentrl/pool": pool.name}
    container = _container(cfg, images, role, list(spec.command), spec.cpus, spec.cpus * JOB_MEMORY_PER_CPU, pool.accelerators)
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": _meta(f"agentrl-{spec.job_id}".lower()[:63], cfg.cluster.namespace, labels),
            "spec": {"suspend": True, "backoffLimit": 0, "ttlSecondsAfterFinished": 86400,
                     "template": {"metadata": {"labels": {**_template_labels(role), "agentrl/job-id": spec.job_id}},
                                  "spec": _pod_spec(cfg, role, container, pool, restart="Never")}}}


def _service(cfg: PlatformConfig, role: str) -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(f"agentrl-{role}", namespace_of(cfg, role)),
            "spec": {"type": "ClusterIP", "selector": _template_labels(role),
                     "ports": [{"name": "http", "port": port_of(cfg, role), "targetPort": "http", "protocol": "TCP"}]}}


def _headless_service(cfg: PlatformConfig, role: str, name: str) -> dict:
    """A Service without a cluster IP: DNS names each pod of a StatefulSet that names it (<pod>.<name>),
    ready or not: a replica that fails a readiness probe for a moment gets no new sandboxes (the
    ClusterIP Service skips it) but still holds and serves the ones it has."""
    svc = _service(cfg, role)
    svc["metadata"]["name"] = name
    svc["spec"] = {"clusterIP": "None", "publishNotReadyAddresses": True,
                   **{k: v for k, v in svc["spec"].items() if k != "type"}}
    return svc


def _deployment(cfg: PlatformConfig, role: str, replicas: int, pod: dict) -> dict:
    labels = _template_labels(role)
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(f"agentrl-{role}", namespace_of(cfg, role)),
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": pod}}}


def _controlplane_deployment(cfg: PlatformConfig, images: dict[str, str]) -> dict:
    cpus, memory = SERVICE_RESOURCES["controlplane"]
    command = ["agentrl", "controlplane", "serve", "--config", CONFIG_PATH,
               "--set", "controlplane.host=0.0.0.0", "--set", f"controlplane.port={PORTS['controlplane']}"]
    container = _container(cfg, images, "controlplane", command, cpus, memory)
    replicas = 2 if cfg.controlplane.state_store.startswith("postgres") else 1  # a SQLite file is one pod's own
    return _deployment(cfg, "controlplane", replicas, _pod_spec(cfg, "controlplane", container))


def _server_command(cfg: PlatformConfig, role: str) -> list[str]:
    return ["agentrl", "serve", role, "--config", CONFIG_PATH, "--host", "0.0.0.0", "--port", str(port_of(cfg, role))]


def _server_deployment(cfg: PlatformConfig, images: dict[str, str], role: str) -> dict:
    cpus, memory = SERVICE_RESOURCES[role]
    container = _container(cfg, images, role, _server_command(cfg, role), cpus, memory)
    return _deployment(cfg, role, 1, _pod_spec(cfg, role, container))


def _sandbox_statefulset(cfg: PlatformConfig, images: dict[str, str], plan: dict[str, float]) -> dict:
    """The sandbox service's replicas (the plan's environment hosts): pods agentrl-sandbox-<i> named
    under SANDBOX_HEADLESS, each serving with sandbox.replica = its pod name."""
    replicas = max(1, int(plan["environments hosts"]))
    cpus = max(1, math.ceil(plan["environments CPU cores"] / replicas))
    memory = plan["environments memory"] * 1e9 / replicas + RUNTIME_MEMORY
    command = [*_server_command(cfg, "sandbox"), "--set", "sandbox.replica=$(POD_NAME)"]  # the kubelet expands $(POD_NAME)
    container = _container(cfg, images, "sandbox", command, cpus, memory)
    container["env"] = [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}, *container.get("env", [])]
    labels = _template_labels("sandbox")
    pod = _pod_spec(cfg, "sandbox", container)
    template: dict = {"metadata": {"labels": labels}, "spec": pod}
    digests = image_digests(cfg)
    if digests:  # the image cache, read-only: a replica runs an image only by a digest the volume holds
        container["volumeMounts"].append({"name": "images", "mountPath": cfg.sandbox.image_cache_dir, "readOnly": True})
        pod["volumes"].append({"name": "images", "persistentVolumeClaim": {"claimName": IMAGES_CLAIM, "readOnly": True}})
        template["metadata"]["annotations"] = {IMAGES_ANNOTATION: ", ".join(f"{h}={d}" for h, d in sorted(digests.items()))}
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": _meta("agentrl-sandbox", namespace_of(cfg, "sandbox")),
            "spec": {"serviceName": SANDBOX_HEADLESS, "replicas": replicas, "podManagementPolicy": "Parallel",
                     "selector": {"matchLabels": labels}, "template": template}}


def _training_jobset(cfg: PlatformConfig, images: dict[str, str], plan: dict[str, float]) -> dict:
    pools = sorted(cfg.controlplane.pools, key=lambda p: -p.priority)
    top = pools[0]
    top_priority = max(cfg.controlplane.priorities, key=lambda p: p.value).name
    ranks = cfg.cluster.gpus_per_node or math.ceil(cfg.training.world_size / cfg.cluster.nodes)

    def replicated(role: str, replicas: int, command: list[str], cpus: float, memory: float, accelerators: int) -> dict:
        container = _container(cfg, images, role, command, cpus, memory, accelerators)
        pod = _pod_spec(cfg, role, container, top, "Never")
        _mount_runs(cfg, pod)
        return {"name": role, "replicas": replicas,
                "template": {"spec": {"backoffLimit": 0, "template": {"metadata": {"labels": _template_labels(role)},
                                                                     "spec": pod}}}}

    jobs = [replicated("trainer", cfg.cluster.nodes, ["agentrl", "stage", "run", "8", "--config", CONFIG_PATH],
                       ranks * max(1, cfg.training.cpu_threads), plan["training memory per rank"] * 1e9 * ranks + RUNTIME_MEMORY,
                       cfg.cluster.gpus_per_node),
            replicated("inference", cfg.inference.replicas,
                       ["agentrl", "serve", "inference", "--config", CONFIG_PATH, "--engine", cfg.inference.engine,
                        "--host", "0.0.0.0", "--port", str(cfg.inference.port)],
                       max(1, cfg.inference.cpu_threads), plan["inference memory per server"] * 1e9 + RUNTIME_MEMORY, top.accelerators)]
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": _meta(JOBSET, cfg.cluster.namespace, {QUEUE_LABEL: queue_name(cfg, top.name),
                                                              PRIORITY_LABEL: f"agentrl-{top_priority}"}),
            "spec": {"suspend": True, "network": {"enableDNSHostnames": True, "subdomain": JOBSET}, "replicatedJobs": jobs}}
