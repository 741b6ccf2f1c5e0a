"""NetworkPolicies for the rendered roles: deny everything, then allow exactly the openings of the
cross-node plan (`agentrl_cli/ops/netplan.py`, layout kubernetes), the same list `agentrl plan` prints.

In each namespace (the main one and the sandbox's): a default deny of all ingress and egress, DNS to
kube-system's kube-dns, and one policy per role. An opening whose reach is `cluster` becomes, for each
client role, an ingress rule of the listening role and an egress rule of the client, on the
opening's ports (a range, such as the ephemeral one collectives use, as port..endPort); a client
that is no role (a Prometheus server) is any pod in the cluster. An opening towards a non-role
listener in the cluster (a harness's allowlisted host) is egress to any pod in the cluster; one
whose reach is `outside` (S3, PostgreSQL, the Kubernetes API server, whose addresses are not the
cluster's pods) is egress to any address. Loopback openings stay inside the pod. Kubelet probes come
from the node and are not subject to these policies on the common CNIs. Belongs here: the rendering.
"""

from __future__ import annotations

from agentrl_cli.config.models import PlatformConfig
from agentrl_cli.ops.controlplane.k8s_names import COMPONENT, PART_OF, ROLES, _meta, namespace_of, sandbox_namespace
from agentrl_cli.ops.netplan import CLUSTER, KUBERNETES, OUTSIDE, Opening, openings

NETWORKING = "networking.k8s.io/v1"
NS_LABEL = "kubernetes.io/metadata.name"
ANYWHERE = [{"ipBlock": {"cidr": "0.0.0.0/0"}}, {"ipBlock": {"cidr": "::/0"}}]
IN_CLUSTER = [{"namespaceSelector": {}}]


def _peer(cfg: PlatformConfig, role: str, here: str) -> dict:
    peer: dict = {"podSelector": {"matchLabels": {PART_OF: "agentrl", COMPONENT: role}}}
    if namespace_of(cfg, role) != here:
        peer["namespaceSelector"] = {"matchLabels": {NS_LABEL: namespace_of(cfg, role)}}
    return peer


def port_entries(o: Opening) -> list[dict]:
    entry: dict = {"protocol": o.protocol, "port": o.first}
    if o.last != o.first:
        entry["endPort"] = o.last
    return [entry]


def _rule(key: str, peers: list[dict], ports: list[dict]) -> dict:
    return {key: peers, "ports": ports}


def _rules(cfg: PlatformConfig, role: str, plan: list[Opening]) -> tuple[list[dict], list[dict]]:
    """(ingress, egress) of `role` from the plan's openings, each rule once."""
    here = namespace_of(cfg, role)
    ingress: list[dict] = []
    egress: list[dict] = []
    for o in plan:
        if o.reach not in (CLUSTER, OUTSIDE):
            continue
        if o.listener == role and o.reach == CLUSTER:
            for c in o.clients:
                rule = _rule("from", [_peer(cfg, c, here)] if c in ROLES else IN_CLUSTER, port_entries(o))
                ingress += [rule] if rule not in ingress else []
        if role in o.clients:
            peers = _peer(cfg, o.listener, here) if o.listener in ROLES else None
            rule = _rule("to", [peers] if peers else (IN_CLUSTER if o.reach == CLUSTER else ANYWHERE), port_entries(o))
            egress += [rule] if rule not in egress else []
    return ingress, egress


def _policy(cfg: PlatformConfig, role: str, plan: list[Opening]) -> dict:
    ingress, egress = _rules(cfg, role, plan)
    spec = {"podSelector": {"matchLabels": {PART_OF: "agentrl", COMPONENT: role}}, "policyTypes": ["Ingress", "Egress"],
            "ingress": ingress, "egress": egress}
    return {"apiVersion": NETWORKING, "kind": "NetworkPolicy", "metadata": _meta(f"agentrl-{role}", namespace_of(cfg, role)),
            "spec": spec}


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
    plan = openings(cfg, KUBERNETES)
    return docs + [_policy(cfg, role, plan) for role in ROLES]
