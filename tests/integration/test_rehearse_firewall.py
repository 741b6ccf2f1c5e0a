"""Firewall rules on simulated nodes come from the same plan as the NetworkPolicies: a planned
connection between roles on different nodes goes through, anything else is refused and reported by
role and port with the plan entry to add; removing one opening from the plan makes the connection
that used it fail, named; the rules live in the nodes' namespaces only, so the host's ruleset is
the same before, during and after, also when a killed rehearsal is reclaimed.

Every address used is from 198.18.0.0/15 inside namespaces these tests create; connects have a
2 s deadline (a refused connection is answered with a reset, so it fails at once)."""

from __future__ import annotations

import errno
import json
import select
import subprocess
import sys

import pytest

from agentrl_cli.config.models import PlatformConfig
from agentrl_cli.core.report import CheckStatus
from agentrl_cli.ops.netplan import KUBERNETES, openings
from agentrl_cli.ops.rehearse.firewall import apply, check, refusals, refused, unavailable
from agentrl_cli.ops.rehearse.host import netns_names
from agentrl_cli.ops.rehearse.leftovers import reclaim
from agentrl_cli.ops.rehearse.nodes import Network

_problem = unavailable()
needs_firewall = pytest.mark.skipif(_problem is not None, reason=f"firewall on simulated nodes unavailable: {_problem}")
# serial("netns"): the rehearsal tests compare the host's named network namespaces and mounts before and
# after; another rehearsal's nodes must not appear in between (pytest-xdist runs test files side by side)
pytestmark = [pytest.mark.integration, pytest.mark.serial("netns")]
PY = sys.executable
CFG = PlatformConfig()  # defaults: inference.port 30000, training.master_port 29500
INFERENCE, MASTER = CFG.inference.port, CFG.training.master_port

SERVER = """
import socket, sys, threading
def serve(s):
    while True:
        c, _ = s.accept(); c.sendall(b"ok"); c.close()
for port in sys.argv[2:]:
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((sys.argv[1], int(port))); s.listen()
    threading.Thread(target=serve, args=(s,), daemon=True).start()
print("ready", flush=True); sys.stdin.read()
"""
PROBE = """
import socket, sys
s = socket.socket(); s.settimeout(2)
try:
    s.connect((sys.argv[1], int(sys.argv[2]))); print(s.recv(10).decode())
except socket.timeout:
    print("timeout")
except OSError as e:
    print(e.errno)
"""


def _host_ruleset() -> str:
    return subprocess.run(["nft", "list", "ruleset"], capture_output=True, text=True, check=True).stdout


def _probe(node, address: str, port: int) -> str:
    """'ok' when the connection went through, else the errno (or 'timeout')."""
    return node.run([PY, "-c", PROBE, address, str(port)], timeout=30, check=True).stdout.strip()


def _serve(node, *ports: int):
    proc = node.popen([PY, "-c", SERVER, node.address, *map(str, ports)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    ready, _, _ = select.select([proc.stdout], [], [], 30)
    assert ready and proc.stdout.readline() == "ready\n"
    return proc


def _rehearse(plan):
    """A network of trainer, inference and sandbox nodes, a server on the trainer's rendezvous port and
    one on inference's HTTP port, each node's rules from `plan`; yields (network, nodes, placement)."""
    net = Network.create()
    try:
        nodes = {role: net.add_node(f"{role}-0") for role in ("trainer", "inference", "sandbox")}
        placement = {role: [node.address] for role, node in nodes.items()}
        for node in nodes.values():
            apply(node, plan, placement)
        _serve(nodes["trainer"], MASTER)
        _serve(nodes["inference"], INFERENCE)
        return net, nodes, placement
    except BaseException:
        net.teardown()
        raise


@needs_firewall
def test_planned_connections_pass_and_a_sandbox_probe_of_the_trainer_is_refused_and_named():
    host_before = _host_ruleset()
    plan = openings(CFG, KUBERNETES)
    net, nodes, placement = _rehearse(plan)
    with net:
        trainer, inference, sandbox = nodes["trainer"], nodes["inference"], nodes["sandbox"]
        assert _host_ruleset() == host_before  # the rules are in the nodes' namespaces only
        assert _probe(trainer, inference.address, INFERENCE) == "ok"  # planned: trainer -> inference.port
        assert _probe(trainer, trainer.address, MASTER) == "ok"  # the trainer's server listens: only the firewall refuses
        assert all(refused(n) == [] for n in nodes.values())
        assert _probe(sandbox, trainer.address, MASTER) == str(errno.ECONNREFUSED)
        assert _probe(sandbox, inference.address, INFERENCE) == str(errno.ECONNREFUSED)  # inference.port's clients: no sandbox
        assert refused(trainer) == [(sandbox.address, MASTER)]
        found = refusals(nodes.values(), plan, placement)
        assert [(r.clients, r.listeners, r.port) for r in found] == [(("sandbox",), ("trainer",), MASTER),
                                                                      (("sandbox",), ("inference",), INFERENCE)]
        assert found[0].message == (f"role sandbox ({sandbox.address}) connected to trainer ({trainer.address}) port {MASTER}, "
                                    "which the plan does not open")
        assert "add an opening to the plan" in found[0].fix and "listener trainer, port 29500, client sandbox" in found[0].fix
        assert found[1].fix.startswith("add sandbox to the clients of the plan's opening inference 30000")
        assert "inference.port" in found[1].fix
    assert _host_ruleset() == host_before


@needs_firewall
def test_with_one_planned_opening_removed_the_connection_that_used_it_fails_naming_role_and_port():
    host_before = _host_ruleset()
    plan = [o for o in openings(CFG, KUBERNETES) if o.key != "inference.port"]
    net, nodes, placement = _rehearse(plan)
    with net:
        trainer, inference = nodes["trainer"], nodes["inference"]
        assert _probe(trainer, inference.address, INFERENCE) == str(errno.ECONNREFUSED)
        result = check(refusals(nodes.values(), plan, placement))
        assert result.status == CheckStatus.FAIL
        assert result.detail == (f"role trainer ({trainer.address}) connected to inference ({inference.address}) "
                                 f"port {INFERENCE}, which the plan does not open")
        assert f"listener inference, port {INFERENCE}, client trainer, reach cluster" in result.hint
    assert _host_ruleset() == host_before


@needs_firewall
def test_a_rehearsal_with_only_planned_connections_passes_the_check_and_reapplying_replaces_the_rules():
    plan = openings(CFG, KUBERNETES)
    net, nodes, placement = _rehearse(plan)
    with net:
        apply(nodes["inference"], plan, placement)  # a second apply replaces the table, not adds to it
        assert _probe(nodes["trainer"], nodes["inference"].address, INFERENCE) == "ok"
        assert check(refusals(nodes.values(), plan, placement)).status == CheckStatus.PASS


KILLED = """
import json, sys, time
from agentrl_cli.config.models import PlatformConfig
from agentrl_cli.ops.netplan import openings
from agentrl_cli.ops.rehearse.firewall import apply
from agentrl_cli.ops.rehearse.nodes import Network
net = Network.create()
nodes = [net.add_node(n) for n in ("trainer-0", "inference-0")]
placement = {"trainer": [nodes[0].address], "inference": [nodes[1].address]}
for node in nodes:
    apply(node, openings(PlatformConfig(), "kubernetes"), placement)
print(json.dumps(net.record.namespaces), flush=True)
time.sleep(600)
"""


@needs_firewall
def test_a_sigkilled_rehearsal_with_firewall_rules_is_reclaimed_and_the_host_ruleset_is_unchanged():
    host_before = _host_ruleset()
    proc = subprocess.Popen([PY, "-c", KILLED], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        assert ready
        namespaces = json.loads(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert set(namespaces) <= set(netns_names())
    counts = reclaim()
    assert (counts["runs"], counts["namespaces"], counts["errors"]) == (1, 3, 0)
    assert not set(namespaces) & set(netns_names())
    assert _host_ruleset() == host_before
