"""The cross-node plan (`agentrl_cli/ops/netplan.py`): its ports follow the config, and the NetworkPolicies,
the Slurm notes and `agentrl plan --json` render the same list; training.master_port reaches the
launcher's argv on several nodes."""

from __future__ import annotations

import re
import socket

import pytest

from agentrl_cli.config.models import PlatformConfig
from agentrl_cli.ops.controlplane.manifests import render_all
from agentrl_cli.ops.controlplane.slurm_conf import network_notes
from agentrl_cli.ops.netplan import (CLUSTER, COLLECTIVES, EPHEMERAL, HOSTS, HTTP, KUBERNETES, LOOPBACK, OBJECT_STORE, OUTSIDE,
                                 RENDEZVOUS, STORE, between_roles, openings, shared_paths)
from agentrl_cli.ops.controlplane.k8s_names import ROLES


def config(**sections) -> PlatformConfig:
    return PlatformConfig.model_validate(sections)


def find(items, **want):
    return [o for o in items if all(getattr(o, k) == v for k, v in want.items())]


# several deployments, each with something the others lack
CONFIGS = {
    "default": {},
    "two nodes, distributed sync, metrics": {
        "cluster": {"nodes": 2, "gpus_per_node": 8}, "training": {"world_size": 16, "weight_sync": "distributed", "master_port": 29611},
        "observe": {"prometheus_port": 9100, "prometheus_addr": "0.0.0.0"}},
    "s3, postgres, allowlist, keys": {
        "data": {"store": "s3", "s3": {"endpoint_url": "http://minio.storage:9000"}},
        "controlplane": {"state_store": "postgresql://agentrl@db:6543/agentrl"},
        "harnesses": [{"name": "terminal_like"},
                      {"name": "tool_api_like", "network": "allowlist", "allowlist": ["127.0.0.1:8080", "api.internal:8443"]}]},
}


def test_the_plan_follows_the_config():
    cfg = config(cluster={"nodes": 2}, training={"world_size": 4, "master_port": 29611},
                 inference={"engine": "sglang", "replicas": 3, "port": 31000}, data={"store": "s3"})
    plan = openings(cfg, HOSTS)
    rdv = find(plan, purpose=RENDEZVOUS)
    assert [(o.listener, o.first, o.last, o.clients, o.reach, o.key) for o in rdv] == \
        [("trainer", 29611, 29611, ("trainer",), CLUSTER, "training.master_port")]
    assert [(o.first, o.last, o.ephemeral) for o in find(plan, listener="trainer", purpose=COLLECTIVES)] == [(*EPHEMERAL, True)]
    servers, router = find(plan, listener="inference", purpose=HTTP)
    assert (servers.first, servers.last, servers.reach) == (31000, 31002, LOOPBACK)  # the run's own servers on 127.0.0.1
    assert (router.first, router.last) == (31003, 31003)  # the SGLang router after the replicas
    assert [(o.listener, o.first, o.reach) for o in find(plan, purpose=OBJECT_STORE)] == [("s3", 443, OUTSIDE)]

    one_node = openings(config(training={"world_size": 2}, inference={"replicas": 3}), HOSTS)
    assert [o.reach for o in find(one_node, purpose=RENDEZVOUS)] == [LOOPBACK]  # one node: a free loopback port
    assert not find(one_node, first=31003) and not find(one_node, purpose=OBJECT_STORE)
    assert [(o.first, o.last) for o in find(one_node, listener="inference")] == [(30000, 30002)]  # hf: no router
    s3 = openings(config(data={"store": "s3", "s3": {"endpoint_url": "http://minio.storage:9000"}}), HOSTS)
    assert [o.first for o in find(s3, purpose=OBJECT_STORE)] == [9000]


def test_servers_elsewhere_and_distributed_sync_are_openings_between_nodes():
    cfg = config(inference={"urls": ["http://10.1.2.3:30500", "http://127.0.0.1:30600"]},
                 training={"weight_sync": "distributed"}, reward={"service_url": "http://reward.internal:8711"})
    plan = openings(cfg, HOSTS)
    assert [(o.first, o.reach) for o in find(plan, listener="inference", purpose=HTTP)] == [(30500, CLUSTER), (30600, LOOPBACK)]
    assert [(o.listener, o.clients, o.reach) for o in find(plan, purpose=STORE)] == [("trainer", ("inference",), CLUSTER)]
    assert [(o.first, o.reach) for o in find(plan, listener="reward")] == [(8711, CLUSTER)]
    assert not find(openings(config(), HOSTS), purpose=STORE)  # disk sync: no group, the weights go through a path
    shared = {p.what: p.shared for p in shared_paths(config(inference={"urls": ["http://10.1.2.3:30500"]}), HOSTS)}
    assert shared["weight exports"] is True and shared["checkpoints"] is False
    assert {p.what: p.shared for p in shared_paths(config(), HOSTS)}["weight exports"] is False


def port_entry(o) -> dict:
    return {"protocol": o.protocol, "port": o.first, **({"endPort": o.last} if o.last != o.first else {})}


def freeze(entry: dict) -> tuple:
    return tuple(sorted(entry.items()))


@pytest.mark.parametrize("name", CONFIGS)
def test_network_policies_open_exactly_the_plans_ports(name):
    cfg = config(**CONFIGS[name])
    plan = openings(cfg, KUBERNETES)
    policies = {d["metadata"]["name"].removeprefix("agentrl-"): d["spec"] for d in render_all(cfg) if d["kind"] == "NetworkPolicy"}
    component = "app.kubernetes.io/component"

    def peer_name(peer: dict) -> str:
        return peer["podSelector"]["matchLabels"][component] if "podSelector" in peer else "any pod" if "namespaceSelector" in peer else "anywhere"

    rendered_in = {(role, peer_name(p), freeze(port)) for role in ROLES for r in policies[role]["ingress"]
                   for p in r["from"] for port in r["ports"]}
    rendered_out = {(role, peer_name(p), freeze(port)) for role in ROLES for r in policies[role]["egress"]
                    for p in r["to"] for port in r["ports"]}
    expected_in = {(o.listener, c, freeze(port_entry(o))) for o, c in between_roles(plan)}
    expected_in |= {(o.listener, "any pod", freeze(port_entry(o))) for o in plan
                    if o.reach == CLUSTER and o.listener in ROLES for c in o.clients if c not in ROLES}
    expected_out = {(c, o.listener, freeze(port_entry(o))) for o, c in between_roles(plan)}
    expected_out |= {(c, "any pod" if o.reach == CLUSTER else "anywhere", freeze(port_entry(o))) for o in plan
                     if o.listener not in ROLES and o.reach in (CLUSTER, OUTSIDE) for c in o.clients}
    assert expected_in and rendered_in == expected_in
    assert rendered_out == expected_out
    assert not [o for o in plan if o.reach == LOOPBACK and any(freeze(port_entry(o)) == p for _, _, p in rendered_in)]


def test_a_port_added_to_the_plan_lands_in_the_policies():
    base = {d["metadata"]["name"]: d for d in render_all(config()) if d["kind"] == "NetworkPolicy"}
    two = {d["metadata"]["name"]: d for d in render_all(config(cluster={"nodes": 2}, training={"world_size": 2, "master_port": 29777}))
           if d["kind"] == "NetworkPolicy"}
    ports = [p for r in two["agentrl-trainer"]["spec"]["ingress"] for p in r["ports"]]
    assert {"protocol": "TCP", "port": 29777} in ports and {"protocol": "TCP", "port": EPHEMERAL[0], "endPort": EPHEMERAL[1]} in ports
    assert base["agentrl-trainer"]["spec"]["ingress"] == []  # one trainer pod, disk sync: nothing comes in


NOTE = re.compile(r"^# (.+?) <- ([\w, ]+): (\w+) (\d+)(?:-(\d+))?(?: \(ephemeral\))?: ")


@pytest.mark.parametrize("name", CONFIGS)
def test_slurm_notes_list_the_same_ports(name):
    cfg = config(**CONFIGS[name])
    notes = network_notes(cfg)
    assert all(line.startswith("#") for line in notes)
    found = set()
    for line in notes:
        m = NOTE.match(line)
        if m:
            first = int(m.group(4))
            found.add((m.group(1), tuple(m.group(2).split(", ")), m.group(3), first, int(m.group(5) or first)))
    plan = openings(cfg, HOSTS)
    assert found == {(o.listener, o.clients or ("operators",), o.protocol, o.first, o.last) for o in plan if o.reach == CLUSTER}
    assert found or "# (none: every listener of this config is on loopback)" in notes
    outbound = [line for line in notes if line.startswith("# outbound: ")]
    assert len(outbound) == len([o for o in plan if o.reach == OUTSIDE])
    for o in (o for o in plan if o.reach == OUTSIDE):
        assert any(f"-> {o.listener} " in line and f"{o.protocol} {o.ports}:" in line for line in outbound)


def test_master_port_reaches_the_launcher_on_several_nodes_only(tmp_path):
    from agentrl_cli.learner.ranks_backend import launcher_command

    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node-a slots=2\nnode-b slots=2\n")
    two = config(cluster={"nodes": 2}, training={"world_size": 4, "master_port": 29611})
    argv = launcher_command(two, tmp_path / "m", tmp_path / "c", hostfile=hostfile)
    assert argv[argv.index("--master_addr") + 1:argv.index("--master_port") + 2] == ["node-a", "--master_port", "29611"]
    with socket.socket() as held:  # one node: a free loopback port, never the configured one (held here)
        held.bind(("127.0.0.1", 0))
        busy = held.getsockname()[1]
        argv = launcher_command(config(training={"world_size": 2, "master_port": busy}), tmp_path / "m", tmp_path / "c")
    assert argv[argv.index("--master_addr") + 1] == "127.0.0.1" and int(argv[argv.index("--master_port") + 1]) != busy


def test_plan_json_has_the_network_section(cli, random_model_dir):
    result, data = cli.json("plan", "--set", f"model.path={random_model_dir}", "--set", "cluster.nodes=2",
                            "--set", "training.world_size=2", "--set", "training.master_port=29612")
    assert result.exit_code == 0 and data["lines"]  # the resource plan is still there
    net = data["network"]
    assert net["layout"] == HOSTS and net["paths"]
    assert {"listener": "trainer", "ports": "29612", "purpose": RENDEZVOUS, "key": "training.master_port", "reach": CLUSTER}.items() \
        <= next(o for o in net["openings"] if o["purpose"] == RENDEZVOUS).items()
    result, k8s = cli.json("plan", "--set", f"model.path={random_model_dir}", "--executor", "kubernetes")
    assert result.exit_code == 0 and k8s["network"]["layout"] == KUBERNETES
    assert any(o["listener"] == "kubernetes-api" for o in k8s["network"]["openings"])
    assert cli("plan", "--executor", "nomad").exit_code == 2


def test_slurm_render_prints_the_notes_after_the_conf(cli):
    result = cli("controlplane", "render", "--executor", "slurm", "--set", "cluster.nodes=2", "--set", "training.world_size=2")
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    first_note = next(i for i, line in enumerate(lines) if line.startswith("#"))
    assert lines[first_note - 1].startswith("PartitionName=") and all(line.startswith("#") for line in lines[first_note:])
    assert any(line.startswith("# trainer <- trainer: TCP 29500: rendezvous") for line in lines)
    result, data = cli.json("controlplane", "render", "--executor", "slurm")
    assert data["notes"] and all(n.startswith("#") for n in data["notes"]) and data["network"]["layout"] == HOSTS
    assert any(p["what"] == "job logs and spool" and p["shared"] for p in data["network"]["paths"])  # on Slurm
