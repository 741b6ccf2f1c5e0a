"""Names and addresses of the rendered Kubernetes objects, shared by the manifests (`manifests.py`) and
their NetworkPolicies (`networkpolicies.py`): roles, ports, labels, namespaces, service URLs, object
metadata, and the fixed resources of the servers without a plan line."""

from __future__ import annotations

from agentrl_cli.config.models import PlatformConfig

KUEUE = "kueue.x-k8s.io/v1beta2"
ROLES = ("controlplane", "trainer", "inference", "gateway", "reward", "sandbox")
SERVERS = ("controlplane", "inference", "gateway", "reward", "sandbox")
# ports the rendered pods pass to `--port` (the inference server's is inference.port)
PORTS = {"sandbox": 8700, "reward": 8710, "gateway": 8730, "controlplane": 8740}
HEALTH_PATH = "/health"  # every server's: inference (embedded and SGLang), reward, sandbox, gateway, control plane
QUEUE_LABEL, PRIORITY_LABEL = "kueue.x-k8s.io/queue-name", "kueue.x-k8s.io/priority-class"
COMPONENT, PART_OF = "app.kubernetes.io/component", "app.kubernetes.io/part-of"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
CONFIG_MAP, CONFIG_PATH = "agentrl-config", "/etc/agentrl/agentrl.yaml"
SECRETS_DIR = "/var/run/secrets/agentrl"
JOBSET = "agentrl-train"
# the sandbox service's replicas keep their sandboxes in memory: a StatefulSet whose pods this headless
# Service names one by one (<pod>.agentrl-sandbox-headless), so a sandbox's calls reach its replica
SANDBOX_HEADLESS = "agentrl-sandbox-headless"
GI = 2**30
# (cpu cores, memory bytes) of the servers without a plan line: the reward service scores through the
# sandbox service, the gateway holds a tokenizer and the sessions, the control plane a lease loop
SERVICE_RESOURCES = {"reward": (1, 1 * GI), "gateway": (1, 2 * GI), "controlplane": (0.5, GI // 2)}
RUNTIME_MEMORY = GI  # Python, torch and agentrl's own state, on top of what the plan counts
JOB_MEMORY_PER_CPU = 2 * GI  # a submitted job names its cores only


def sa_name(role: str) -> str:
    return f"agentrl-{role}"


def queue_name(cfg: PlatformConfig, pool: str) -> str:
    return f"{cfg.cluster.kueue_queue}-{pool}"


def sandbox_namespace(cfg: PlatformConfig) -> str:
    return f"{cfg.cluster.namespace}-sandbox"


def namespace_of(cfg: PlatformConfig, role: str) -> str:
    return sandbox_namespace(cfg) if role == "sandbox" else cfg.cluster.namespace


def port_of(cfg: PlatformConfig, role: str) -> int:
    return cfg.inference.port if role == "inference" else PORTS[role]


def service_url(cfg: PlatformConfig, role: str) -> str:
    return f"http://agentrl-{role}.{namespace_of(cfg, role)}.svc:{port_of(cfg, role)}"


def sandbox_replica_url(cfg: PlatformConfig) -> str:
    """sandbox.replica_url of the rendered StatefulSet: each replica (pod) by its name under the headless Service."""
    return f"http://{{replica}}.{SANDBOX_HEADLESS}.{sandbox_namespace(cfg)}.svc:{port_of(cfg, 'sandbox')}"


def inference_urls(cfg: PlatformConfig) -> list[str]:
    """Each inference pod of the training JobSet by its stable hostname (JobSet DNS hostnames)."""
    return [f"http://{JOBSET}-inference-{i}-0.{JOBSET}.{cfg.cluster.namespace}.svc:{cfg.inference.port}"
            for i in range(cfg.inference.replicas)]


def _meta(name: str, namespace: str | None = None, labels: dict | None = None) -> dict:
    meta: dict = {"name": name, "labels": {PART_OF: "agentrl", **(labels or {})}}
    if namespace is not None:
        meta["namespace"] = namespace
    return meta
