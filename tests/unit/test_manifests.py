"""Kubernetes and Kueue manifests: rendered for two pools and two priorities, they validate against the
Kubernetes, Kueue v1beta2 and JobSet schemas; broken ones fail; no cluster means the checks say what would run."""

from __future__ import annotations

import copy

import pytest
import yaml

from pydantic import SecretStr

from agentrl_cli.config.load import load_config
from agentrl_cli.config.models import PlatformConfig
from agentrl_cli.ops.controlplane.executor import ExecutorUnavailable
from agentrl_cli.ops.controlplane.kubernetes import KubernetesExecutor
from agentrl_cli.ops.controlplane.manifests import render_all
from agentrl_cli.ops.controlplane.slurm_conf import pool_lines, single_node_conf
from agentrl_cli.ops.controlplane.validate import validate_documents
from agentrl_cli.core.errors import ConfigError
from agentrl_cli.ops.image.names import RUN_GID, RUN_UID


@pytest.fixture
def cfg() -> PlatformConfig:
    return PlatformConfig.model_validate({
        "controlplane": {
            "pools": [{"name": "rollout", "capacity": 8, "quota": 4, "priority": 1, "preemptible": True,
                       "node_labels": {"agentrl/pool": "rollout"}},
                      {"name": "train", "capacity": 64, "quota": 2, "priority": 10, "accelerators": 8,
                       "node_labels": {"agentrl/pool": "train"}}],
            "priorities": [{"name": "low", "value": 100}, {"name": "high", "value": 1000}]},
        "cluster": {"nodes": 2, "gpus_per_node": 8, "accelerator_product": "NVIDIA-H100-80GB-HBM3", "namespace": "rl"}})


def by(docs, kind, name=None):
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def pod_specs(docs):
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet", "Job"):
            yield d["spec"]["template"]["spec"]
        elif d["kind"] == "JobSet":
            yield from (rj["template"]["spec"]["template"]["spec"] for rj in d["spec"]["replicatedJobs"])


def test_two_pools_and_two_priorities_render_and_validate(cfg):
    docs = render_all(cfg)
    assert validate_documents(docs) == []
    assert {d["metadata"]["name"] for d in by(docs, "ResourceFlavor")} == {"agentrl-rollout", "agentrl-train"}
    assert [d["value"] for d in by(docs, "WorkloadPriorityClass")] == [100, 1000]
    train_cq = by(docs, "ClusterQueue", "agentrl-train")[0]["spec"]
    quotas = {r["name"]: r["nominalQuota"] for r in train_cq["resourceGroups"][0]["flavors"][0]["resources"]}
    assert quotas == {"cpu": 64, "pods": 2, "nvidia.com/gpu": 16}
    assert train_cq["preemption"]["withinClusterQueue"] == "Never"
    assert by(docs, "ClusterQueue", "agentrl-rollout")[0]["spec"]["preemption"]["withinClusterQueue"] == "LowerPriority"
    job = by(docs, "Job", "agentrl-noop-train")[0]
    pod = job["spec"]["template"]["spec"]
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "agentrl-train" and job["spec"]["suspend"] is True
    assert pod["nodeSelector"] == {"agentrl/pool": "train"}
    term = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
    assert term["matchExpressions"][0]["values"] == ["NVIDIA-H100-80GB-HBM3"]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"
    trainer = by(docs, "JobSet")[0]["spec"]["replicatedJobs"][0]
    assert trainer["replicas"] == 2


def test_each_role_has_its_own_account_and_only_the_control_plane_has_api_rights(cfg):
    docs = render_all(cfg)
    accounts = {d["metadata"]["name"]: d["automountServiceAccountToken"] for d in by(docs, "ServiceAccount")}
    assert accounts == {"agentrl-controlplane": True, "agentrl-trainer": False, "agentrl-inference": False,
                        "agentrl-gateway": False, "agentrl-reward": False, "agentrl-sandbox": False}
    pods = [p for p in pod_specs(docs)]
    assert {p["serviceAccountName"] for p in pods if p["automountServiceAccountToken"]} == {"agentrl-controlplane"}
    (role,) = by(docs, "Role")
    (binding,) = by(docs, "RoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "agentrl-controlplane", "namespace": "rl"}]
    verbs = {v for rule in role["rules"] for v in rule["verbs"]}
    assert "*" not in verbs and not any("secrets" in rule["resources"] for rule in role["rules"])
    assert not by(docs, "ClusterRole") and not by(docs, "Secret")


def test_secrets_are_files_from_secrets_never_a_config_map_value_or_argv(cfg, tmp_path):
    cfg.controlplane.state_store = "postgresql://agentrl:hunter2@db:5432/agentrl"
    cfg.data.store = "s3"
    cfg.inference.api_key = SecretStr("sk-planted")
    docs = render_all(cfg)
    text = yaml.safe_dump_all(docs)
    assert "hunter2" not in text and "sk-planted" not in text and "**********" not in text and "secretKeyRef" not in text
    cp = by(docs, "Deployment", "agentrl-controlplane")[0]["spec"]["template"]["spec"]
    assert {"name": "AGENTRL_PGPASSWORD_FILE", "value": "/var/run/secrets/agentrl/agentrl-state-store/password"} in cp["containers"][0]["env"]
    assert {"name": "agentrl-state-store", "secret": {"secretName": "agentrl-state-store", "defaultMode": 0o440,
                                                      "items": [{"key": "password", "path": "password"}]}} in cp["volumes"]
    trainer = by(docs, "Job")[0]["spec"]["template"]["spec"]["containers"][0]
    assert {e["name"] for e in trainer["env"]} == {"AGENTRL_INFERENCE__API_KEY_FILE", "AGENTRL_SANDBOX__API_KEY_FILE",
                                                   "AWS_SHARED_CREDENTIALS_FILE"}
    sandbox = by(docs, "StatefulSet", "agentrl-sandbox")[0]["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "AGENTRL_SANDBOX__API_KEY_FILE",  # it refuses to start on 0.0.0.0 without one
            "value": "/var/run/secrets/agentrl/agentrl-sandbox-api-key/api_key"} in sandbox["env"]
    config = yaml.safe_load(by(docs, "ConfigMap")[0]["data"]["agentrl.yaml"])
    assert config["inference"]["api_key"] is None and config["controlplane"]["state_store"] == "postgresql://agentrl@db:5432/agentrl"
    assert validate_documents(docs) == []
    # what the pod does with the mounted file: the config loader reads the key from it
    (tmp_path / "api_key").write_text("sk-from-the-file\n")
    loaded = load_config(None, env={"AGENTRL_INFERENCE__API_KEY_FILE": str(tmp_path / "api_key")}).config
    assert loaded.inference.api_key.get_secret_value() == "sk-from-the-file"
    with pytest.raises(ConfigError, match="AGENTRL_INFERENCE__API_KEY_FILE names"):
        load_config(None, env={"AGENTRL_INFERENCE__API_KEY_FILE": str(tmp_path / "missing")})


def test_every_server_has_a_service_probes_on_health_and_binds_all_interfaces_in_pods(cfg):
    docs = render_all(cfg)
    services = {d["metadata"]["name"]: d for d in by(docs, "Service") if d["spec"].get("clusterIP") != "None"}
    assert set(services) == {f"agentrl-{r}" for r in ("controlplane", "inference", "gateway", "reward", "sandbox")}
    assert [d["metadata"]["name"] for d in by(docs, "Service") if d not in services.values()] == ["agentrl-sandbox-headless"]
    containers = {c["name"]: c for p in pod_specs(docs) for c in p["containers"]}
    for name, svc in services.items():
        role = name.removeprefix("agentrl-")
        c = containers[role]
        assert svc["spec"]["selector"] == {"app.kubernetes.io/part-of": "agentrl", "app.kubernetes.io/component": role}
        assert svc["metadata"]["namespace"] == ("rl-sandbox" if role == "sandbox" else "rl")
        assert c["ports"][0]["containerPort"] == svc["spec"]["ports"][0]["port"]
        assert c["readinessProbe"]["httpGet"] == c["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
        cmd = " ".join(c["command"])
        assert "--host 0.0.0.0" in cmd or "controlplane.host=0.0.0.0" in cmd, cmd
        assert c["resources"]["requests"] == c["resources"]["limits"] and "memory" in c["resources"]["limits"]
    assert containers["inference"]["startupProbe"]["failureThreshold"] == 30  # inference.startup_timeout_s 300 / 10 s
    config = yaml.safe_load(by(docs, "ConfigMap")[0]["data"]["agentrl.yaml"])
    assert config["inference"]["urls"] == ["http://agentrl-train-inference-0-0.agentrl-train.rl.svc:30000"]
    assert config["sandbox"]["service_url"] == "http://agentrl-sandbox.rl-sandbox.svc:8700"
    assert PlatformConfig().sandbox.host == PlatformConfig().reward.host == PlatformConfig().gateway.host == "127.0.0.1"


def test_each_sandbox_replica_has_a_stable_address_that_the_client_config_uses(cfg, tmp_path):
    """The sandbox replicas keep their sandboxes in memory: a StatefulSet whose headless Service gives
    pod i the DNS name <statefulset>-<i>.<serviceName>.<namespace>.svc, each pod names itself
    (sandbox.replica = its pod name) in its sandboxes' ids, and the ConfigMap's sandbox.replica_url
    turns that name into exactly that address, on the port the pods serve."""
    docs = render_all(cfg)
    assert not by(docs, "Deployment", "agentrl-sandbox")
    (sts,) = by(docs, "StatefulSet", "agentrl-sandbox")
    ns, replicas = sts["metadata"]["namespace"], sts["spec"]["replicas"]
    assert replicas >= 2  # the plan's environment hosts for this config: the case that needs routing
    (headless,) = [d for d in by(docs, "Service", sts["spec"]["serviceName"]) if d["metadata"]["namespace"] == ns]
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True
    assert headless["spec"]["selector"] == sts["spec"]["selector"]["matchLabels"] == sts["spec"]["template"]["metadata"]["labels"]
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    port = container["ports"][0]["containerPort"]
    assert headless["spec"]["ports"][0]["port"] == port
    cmd = container["command"]
    assert cmd[cmd.index("--set", cmd.index("--port")) + 1] == "sandbox.replica=$(POD_NAME)"
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in container["env"]
    for config_map in by(docs, "ConfigMap"):  # the clients' (trainer, reward) and the sandbox pods' own
        path = tmp_path / f"{config_map['metadata']['namespace']}.yaml"
        path.write_text(config_map["data"]["agentrl.yaml"])
        client = load_config(path, env={}).config.sandbox
        assert client.service_url == f"http://agentrl-sandbox.{ns}.svc:{port}"  # creation: any replica
        for i in range(replicas):
            pod = f"{sts['metadata']['name']}-{i}"
            assert client.replica_url.replace("{replica}", pod) == f"http://{pod}.{headless['metadata']['name']}.{ns}.svc:{port}"
            # what the pod's `--set sandbox.replica=$(POD_NAME)` gives its service once the kubelet expands it
            assert load_config(path, [cmd[-1].replace("$(POD_NAME)", pod)], env={}).config.sandbox.replica == pod
    assert validate_documents(docs) == []


def test_servers_that_keep_state_per_client_run_one_replica_or_route_to_each():
    """The sandbox service (sandboxes) and the gateway (agent sessions) hold each client's state in
    memory: several replicas only as a StatefulSet the clients address replica by replica."""
    cfg = PlatformConfig.model_validate({"cluster": {"namespace": "rl"}})
    docs = render_all(cfg)
    workloads = {d["metadata"]["name"]: d for d in docs if d["kind"] in ("Deployment", "StatefulSet")}
    for role in ("sandbox", "gateway"):
        w = workloads[f"agentrl-{role}"]
        assert w["spec"]["replicas"] == 1 or (w["kind"] == "StatefulSet" and by(docs, "Service", w["spec"]["serviceName"])), role
    config = yaml.safe_load(by(docs, "ConfigMap")[0]["data"]["agentrl.yaml"])
    assert "{replica}" in config["sandbox"]["replica_url"]
    # a sandbox service of one's own (sandbox.service_url given) is left as configured
    own = PlatformConfig.model_validate({"sandbox": {"service_url": "http://sandboxes.example:8700"}})
    assert yaml.safe_load(by(render_all(own), "ConfigMap")[0]["data"]["agentrl.yaml"])["sandbox"]["replica_url"] == ""


def test_pods_meet_the_restricted_standard_except_the_documented_sandbox(cfg):
    docs = render_all(cfg)
    levels = {d["metadata"]["name"]: d["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] for d in by(docs, "Namespace")}
    assert levels == {"rl": "restricted", "rl-sandbox": "privileged"}
    for pod in pod_specs(docs):
        sandbox = pod["serviceAccountName"] == "agentrl-sandbox"
        assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] == RUN_UID
        assert pod["securityContext"]["seccompProfile"]["type"] == ("Unconfined" if sandbox else "RuntimeDefault")
        assert pod.get("hostUsers", True) is not sandbox
        for c in pod["containers"]:
            ctx = c["securityContext"]
            assert ctx["allowPrivilegeEscalation"] is False and ctx["capabilities"] == {"drop": ["ALL"]}
            assert ctx["readOnlyRootFilesystem"] and (ctx["runAsUser"], ctx["runAsGroup"]) == (RUN_UID, RUN_GID)
            writable = {m["mountPath"] for m in c["volumeMounts"] if not m.get("readOnly")}
            runs = {m["mountPath"] for m in c["volumeMounts"] if m["name"] == "runs"}  # the JobSet's (test_manifests_volume.py)
            assert writable == {"/tmp", "/home/agentrl", "/var/lib/agentrl"} | runs


def test_network_policies_deny_by_default_and_allow_the_roles_edges(cfg):
    docs = render_all(cfg)
    policies = {(d["metadata"]["namespace"], d["metadata"]["name"]): d["spec"] for d in by(docs, "NetworkPolicy")}
    for ns in ("rl", "rl-sandbox"):
        assert policies[(ns, "agentrl-default-deny")] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}

    def sources(ns, role, port=None):
        rules = policies[(ns, f"agentrl-{role}")]["ingress"]
        return {p["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for r in rules for p in r["from"]
                if port is None or {"protocol": "TCP", "port": port} in r.get("ports", [])}

    assert sources("rl-sandbox", "sandbox", 8700) == {"trainer", "reward", "controlplane"}
    assert sources("rl", "reward", 8710) == {"trainer", "controlplane"}
    assert sources("rl", "inference") == {"trainer", "gateway", "controlplane"}
    assert sources("rl", "trainer") == {"trainer"}  # inference joins the trainer only with training.weight_sync: distributed
    assert sources("rl", "controlplane") == set()
    sandbox_out = policies[("rl-sandbox", "agentrl-sandbox")]["egress"]
    assert sandbox_out == [{"to": [{"podSelector": {"matchLabels": {"app.kubernetes.io/part-of": "agentrl",
                                                                    "app.kubernetes.io/component": "gateway"}},
                                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "rl"}}}],
                            "ports": [{"protocol": "TCP", "port": 8730}]}]


@pytest.mark.parametrize("break_it, words", [
    (lambda d: by(d, "ClusterQueue")[0]["spec"].__setitem__("cohort", "x"), "'cohort' was unexpected"),
    (lambda d: by(d, "Job")[0]["spec"]["template"]["spec"]["containers"][0].__setitem__("gpu", 1), "'gpu' was unexpected"),
    (lambda d: by(d, "LocalQueue")[0].__setitem__("apiVersion", "kueue.x-k8s.io/v1beta1"), "no schema for apiVersion"),
    (lambda d: by(d, "WorkloadPriorityClass")[0].__setitem__("value", "high"), "is not of type 'integer'"),
    (lambda d: by(d, "LocalQueue")[0]["spec"].__setitem__("clusterQueue", "nosuch"), "is not a rendered ClusterQueue"),
    (lambda d: by(d, "Role")[0]["rules"][0].pop("verbs"), "'verbs' is a required property"),
    (lambda d: by(d, "StatefulSet")[0]["spec"].__setitem__("serviceName", "nosuch"), "is not a rendered Service"),
    (lambda d: by(d, "StatefulSet")[0]["spec"].__setitem__("serviceNames", "x"), "'serviceNames' was unexpected"),
])
def test_a_broken_manifest_fails_naming_the_field(cfg, break_it, words):
    docs = copy.deepcopy(render_all(cfg))
    break_it(docs)
    errors = validate_documents(docs)
    assert errors and any(words in e for e in errors), errors


def test_without_a_cluster_the_kubernetes_executor_says_what_would_run(cfg):
    with pytest.raises(ExecutorUnavailable) as info:
        KubernetesExecutor(cfg).check()
    assert "would apply" in info.value.message and "LocalQueue agentrl-train" in info.value.message
    assert "cluster.kubeconfig" in info.value.hint


def test_slurm_conf_maps_pools_to_partitions_tiers_preemption_and_quota_licenses(cfg):
    lines = pool_lines(cfg.controlplane)
    assert "Licenses=rollout_jobs:4,train_jobs:2" in lines
    train = next(line for line in lines if line.startswith("PartitionName=train"))
    rollout = next(line for line in lines if line.startswith("PartitionName=rollout"))
    assert "PriorityTier=10" in train and "PreemptMode=OFF" in train and "MaxCPUsPerNode=64" in train
    assert "PriorityTier=1 " in rollout and "PreemptMode=REQUEUE" in rollout
    assert "NodeName=localhost NodeAddr=127.0.0.1 CPUs=64" in single_node_conf(cfg.controlplane)


@pytest.mark.e2e
def test_render_writes_one_file_per_object_and_validate_checks_them(cli, cfg, tmp_path, write_yaml):
    path = write_yaml(yaml.safe_dump({"controlplane": cfg.controlplane.model_dump(mode="json"),
                                      "cluster": cfg.cluster.model_dump(mode="json")}))
    result, data = cli.json("controlplane", "render", "--config", str(path), "--out", str(tmp_path / "m"))
    assert result.exit_code == 0 and data["valid"] and len(data["files"]) == len(data["objects"])
    result, data = cli.json("controlplane", "validate", *data["files"])
    assert result.exit_code == 0 and data["valid"]
    broken = tmp_path / "m" / "broken.yaml"
    broken.write_text("apiVersion: kueue.x-k8s.io/v1beta2\nkind: LocalQueue\nmetadata: {name: q}\nspec: {clusterqueue: x}\n")
    result, data = cli.json("controlplane", "validate", str(broken))
    assert result.exit_code == 1 and "'clusterqueue' was unexpected" in data["errors"][0]
    (tmp_path / "bad.yaml").write_text("kind: Job\n  spec: [\n")
    result = cli("controlplane", "validate", str(tmp_path / "bad.yaml"))
    assert result.exit_code == 2 and "is not valid YAML at line" in result.stderr and "Traceback" not in result.output


@pytest.mark.e2e
def test_render_for_slurm_prints_the_partition_lines(cli):
    result = cli("controlplane", "render", "--executor", "slurm")
    assert result.exit_code == 0 and "PartitionName=rollout" in result.stdout and "Licenses=rollout_jobs:2,train_jobs:1" in result.stdout


def test_vllm_pods_are_sized_as_sglangs_and_serve_vllm(cfg):
    """The inference pods of a vLLM run: the same resources, accelerators and probes as SGLang's, the
    container serving `--engine vllm` (which execs vLLM's server with the mounted config)."""
    def inference_container(engine: str) -> dict:
        c = cfg.model_copy(update={"inference": cfg.inference.model_copy(update={"engine": engine, "replicas": 2})})
        docs = render_all(c)
        validate_documents(docs)
        return next(x for p in pod_specs(docs) for x in p["containers"] if x["name"] == "inference")

    sglang, vllm = inference_container("sglang"), inference_container("vllm")
    assert vllm["resources"] == sglang["resources"] and "nvidia.com/gpu" in vllm["resources"]["limits"]
    assert vllm["readinessProbe"] == sglang["readinessProbe"] and vllm["startupProbe"] == sglang["startupProbe"]
    assert vllm["command"][vllm["command"].index("--engine") + 1] == "vllm"


def test_sandbox_pods_with_harness_images_validate(cfg, tmp_path):
    from tests.image_layouts import entry, tar_layer, write_layout

    layout = write_layout(tmp_path / "layout", [tar_layer([entry("f", b"x")])], tag="env")
    cfg.harnesses[0].image = f"oci:{layout}:env"
    docs = render_all(cfg)
    assert validate_documents(docs) == []
    (sts,) = by(docs, "StatefulSet")
    assert sts["spec"]["template"]["metadata"]["annotations"]
