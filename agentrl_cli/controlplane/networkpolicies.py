"""NetworkPolicies for the rendered roles: deny everything, then allow the east-west traffic the roles
need and the few ways out that each one has.

In each namespace (the main one and the sandbox's): a default deny of all ingress and egress, DNS to
kube-system's kube-dns, and one policy per role whose ingress and egress are the `EDGES` that end or
start at it. Ways out of the cluster: the control plane to the Kubernetes API server (TCP 443 and
6443: its address is the cluster's own, so any address) and to PostgreSQL (the state store URL's
port); the trainer to the S3 endpoint's port when data.store is s3. Environment (sandbox) pods reach
nothing but the gateway and their harnesses' allowlists: an entry naming a host opens its port
towards pods in the cluster only (the relay in the sandbox pod connects for the sandbox; see
sandbox/network.py); loopback entries stay inside the pod. Kubelet probes come from the node and
are not subject to these policies on the common CNIs. Belongs here: the edges and their rendering.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from agentrl_cli.config.models import PlatformConfig
from agentrl_cli.controlplane.k8s_names import (COMPONENT, PART_OF, _meta, namespace_of, port_of, sandbox_namespace)

NETWORKING = "networking.k8s.io/v1"
NS_LABEL = "kubernetes.io/metadata.name"
ANYWHERE = [{"ipBlock": {"cidr": "0.0.0.0/0"}}, {"ipBlock": {"cidr": "::/0"}}]
# (from, to, True = the server's port only, False = every port: NCCL/gloo and rendezvous pick theirs)
EDGES = [
    ("trainer", "trainer", False),      # the ranks of a multi-node run: rendezvous and collectives
    ("trainer", "inference", False),    # generation over HTTP; weight sync (NCCL/gloo with training.weight_sync: distributed)
    ("inference", "trainer", False),    # distributed weight sync: the servers join the trainer's process group
    ("trainer", "reward", True),        # rollout -> reward
    ("trainer", "sandbox", True),       # rollout -> sandbox
    ("trainer", "gateway", True),       # rollout -> gateway
    ("reward", "sandbox", True),        # hidden-test verifiers run in sandboxes
    ("gateway", "inference", True),     # the gateway's chat calls
    ("sandbox", "gateway", True),       # agent harnesses in sandboxes call the gateway (their allowlist)
    ("controlplane", "inference", True),  # control plane -> workers: health and status
    ("controlplane", "reward", True),
    ("controlplane", "sandbox", True),
    ("controlplane", "gateway", True),
]
ROLES = ("controlplane", "trainer", "inference", "gateway", "reward", "sandbox")


def _peer(cfg: PlatformConfig, role: str, here: str) -> dict:
    peer: dict = {"podSelector": {"matchLabels": {PART_OF: "agentrl", COMPONENT: role}}}
    if namespace_of(cfg, role) != here:
        peer["namespaceSelector"] = {"matchLabels": {NS_LABEL: namespace_of(cfg, role)}}
    return peer


def _ports(cfg: PlatformConfig, role: str, server_port: bool) -> list[dict]:
    return [{"protocol": "TCP", "port": port_of(cfg, role)}] if server_port else []


def _rule(key: str, peers: list[dict], ports: list[dict]) -> dict:
    rule: dict = {key: peers}
    if ports:
        rule["ports"] = ports
    return rule


def _outside(cfg: PlatformConfig, role: str) -> list[dict]:
    """Egress rules of `role` beyond the edges."""
    out = []
    if role == "controlplane":
        out.append(_rule("to", ANYWHERE, [{"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 6443}]))
        if cfg.controlplane.state_store.startswith("postgres"):
            out.append(_rule("to", ANYWHERE, [{"protocol": "TCP", "port": urlsplit(cfg.controlplane.state_store).port or 5432}]))
    if role == "trainer" and cfg.data.store == "s3":
        endpoint = urlsplit(cfg.data.s3.endpoint_url or "https://s3.amazonaws.com")
        out.append(_rule("to", ANYWHERE, [{"protocol": "TCP", "port": endpoint.port or (80 if endpoint.scheme == "http" else 443)}]))
    if role == "sandbox":
        ports = sorted({int(e.rpartition(":")[2]) for h in cfg.harnesses if h.network == "allowlist" for e in h.allowlist
                        if not _is_loopback(e.rpartition(":")[0])})
        if ports:
            out.append(_rule("to", [{"namespaceSelector": {}}], [{"protocol": "TCP", "port": p} for p in ports]))
    return out


def _is_loopback(host: str) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host.lower() == "localhost"


def _policy(cfg: PlatformConfig, role: str) -> dict:
    here = namespace_of(cfg, role)
    ingress = [_rule("from", [_peer(cfg, src, here)], _ports(cfg, dst, own)) for src, dst, own in EDGES if dst == role]
    egress = [_rule("to", [_peer(cfg, dst, here)], _ports(cfg, dst, own)) for src, dst, own in EDGES if src == role]
    egress += _outside(cfg, role)
    spec = {"podSelector": {"matchLabels": {PART_OF: "agentrl", COMPONENT: role}}, "policyTypes": ["Ingress", "Egress"],
            "ingress": ingress, "egress": egress}
    return {"apiVersion": NETWORKING, "kind": "NetworkPolicy", "metadata": _meta(f"agentrl-{role}", here), "spec": spec}


def network_policies(cfg: PlatformConfig) -> list[dict]:
    docs = []
    for ns in (cfg.cluster.namespace, sandbox_namespace(cfg)):
        docs.append({"apiVersion": NETWORKING, "kind": "NetworkPolicy", "metadata": _meta("agentrl-default-deny", ns),
                     "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}})
        dns = [{"namespaceSelector": {"matchLabels": {NS_LABEL: "kube-system"}},
                "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}]
        docs.append({"apiVersion": NETWORKING, "kind": "NetworkPolicy", "metadata": _meta("agentrl-dns", ns),
                     "spec": {"podSelector": {}, "policyTypes": ["Egress"],
                              "egress": [_rule("to", dns, [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}])]}})
    return docs + [_policy(cfg, role) for role in ROLES]
