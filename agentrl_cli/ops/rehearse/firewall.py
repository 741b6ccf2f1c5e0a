"""Firewall rules on simulated nodes, generated from the cross-node plan (`ops/netplan.py`) the
NetworkPolicies render from (`ops/controlplane/networkpolicies.py`): deny by default, allow exactly
the planned openings between roles, and record what was refused so a rehearsal can name it.

Each node gets one nftables table, `inet agentrl`, in its own network namespace (`ip netns exec NS
nft -f -`; the host's ruleset is never touched). Its `input` chain has policy drop and accepts:
packets of connections already accepted (ct state established,related), the loopback interface, and
for every opening of reach `cluster` whose listening role is placed on this node (or of reach `outside`
whose service, S3 or PostgreSQL, a rehearsal placed on it), the opening's
ports (a range as first-last) from the addresses of its client roles' nodes; a client that is no
role (a Prometheus server) is any address, as the NetworkPolicies let any pod in. Openings of reach
`loopback` stay inside a node. A new TCP connection that
no rule accepts is added to the dynamic set `refused` (source address . destination port) and
answered with a TCP reset, so the client fails at once (connection refused) rather than after a
timeout; anything else not accepted is dropped by the policy. `refused(node)` reads the set back,
and `refusals()` names, for each entry, the roles on both ends, the port and the plan entry to add.
IPv4 only, like the nodes' addresses. Outgoing traffic is not filtered (no output chain): a
connection is judged once, where it arrives.

The rules live in the node's namespace and are deleted with it: a teardown or `leftovers.reclaim()`
removes them with nothing more to do.

Belongs here: rendering a node's rules from the plan, applying them, reading what each planned
opening let in (`used`: every accept rule counts), reading the refusals and naming the fix. Does not: which roles run on which node (the caller's `placement`: role -> node
addresses), making nodes (`nodes.py`), the plan itself (`ops/netplan.py`).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from agentrl_cli.core.report import Check
from agentrl_cli.ops.controlplane.k8s_names import ROLES
from agentrl_cli.ops.netplan import CLUSTER, LOOPBACK, Opening
from agentrl_cli.ops.rehearse.host import NodesUnavailable
from agentrl_cli.ops.rehearse.host import unavailable as nodes_unavailable
from agentrl_cli.ops.rehearse.nodes import Node

TABLE = "agentrl"
REFUSED = "refused"
PLAN_FILE = "agentrl_cli/ops/netplan.py"


def unavailable() -> NodesUnavailable | None:
    """Why firewall rules cannot be put on simulated nodes here (no nodes, or no `nft`); None when they can."""
    problem = nodes_unavailable()
    if problem is None and shutil.which("nft") is None:
        problem = NodesUnavailable("firewall rules on simulated nodes need nft, not found on PATH",
                                   "install it: apt-get install -y nftables")
    return problem


def _quote(text: str) -> str:
    return '"' + text.replace('"', "'").replace("\\", "/")[:120] + '"'


def _addresses(roles: Iterable[str], placement: Mapping[str, Sequence[str]]) -> list[str]:
    return sorted({a for r in roles for a in placement.get(r, ())})


def ruleset(plan: Sequence[Opening], placement: Mapping[str, Sequence[str]], address: str) -> str:
    """The nftables ruleset of the node at `address`: the planned openings of the roles placed
    there (`placement`: role -> its nodes' addresses), from their clients' nodes only."""
    here = {role for role, addrs in placement.items() if address in addrs}
    accepts = []
    for o in plan:
        if o.reach == LOOPBACK or o.listener not in here:  # an outside service (S3, PostgreSQL) placed on a node counts
            continue
        ports = str(o.first) if o.first == o.last else f"{o.first}-{o.last}"
        proto = o.protocol.lower()
        roles = [c for c in o.clients if c in ROLES]
        others = [c for c in o.clients if c not in ROLES]
        sources = _addresses(roles, placement)
        what = f"{o.listener} {o.ports} {o.purpose} ({o.key or 'fixed port'}) from"
        if sources:
            accepts.append(f"ip saddr {{ {', '.join(sources)} }} {proto} dport {ports} counter accept "
                           f"comment {_quote(' '.join([what, *roles]))}")
        if others:
            accepts.append(f"{proto} dport {ports} counter accept comment {_quote(' '.join([what, *others]))}")
    lines = [f"table inet {TABLE} {{",
             f"  set {REFUSED} {{ type ipv4_addr . inet_service; flags dynamic; size 65535; }}",
             "  chain input {",
             "    type filter hook input priority filter; policy drop;",
             "    ct state established,related accept",
             '    iif "lo" accept',
             *[f"    {a}" for a in dict.fromkeys(accepts)],
             f"    ct state new meta l4proto tcp add @{REFUSED} {{ ip saddr . tcp dport }} counter reject with tcp reset",
             "  }",
             "}"]
    return "\n".join(lines) + "\n"


def _nft(node: Node, *args: str, input: str | None = None) -> str:
    argv = ["ip", "netns", "exec", node.netns, "nft", *args]
    done = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise NodesUnavailable(f"`{' '.join(argv)}` failed on node {node.name}: {done.stderr.strip() or done.returncode}",
                               "see nft's message; `agentrl sandbox reclaim` removes what a failed rehearsal left")
    return done.stdout


def apply(node: Node, plan: Sequence[Opening], placement: Mapping[str, Sequence[str]]) -> str:
    """Replace the node's `inet agentrl` table with the rules for its roles; returns the ruleset applied."""
    text = ruleset(plan, placement, node.address)
    # one transaction: create-then-delete makes a re-apply replace the table, and a first apply work
    _nft(node, "-f", "-", input=f"add table inet {TABLE}\ndelete table inet {TABLE}\n{text}")
    return text


def refused(node: Node) -> list[tuple[str, int]]:
    """(source address, destination port) of each new TCP connection the node's rules refused, sorted."""
    found = json.loads(_nft(node, "-j", "list", "set", "inet", TABLE, REFUSED))
    out = set()
    for item in found.get("nftables", []):
        for elem in item.get("set", {}).get("elem", []):
            if isinstance(elem, dict) and "elem" in elem:  # an element with a counter or timeout of its own
                elem = elem["elem"].get("val", elem["elem"])
            if isinstance(elem, dict) and "concat" in elem:
                source, port = elem["concat"]
                out.add((str(source), int(port)))
    return sorted(out)


def used(node: Node) -> list[dict]:
    """The node's planned openings that let connections in, each `{"opening": its rule's comment (listener,
    ports, purpose, key, clients), "packets"}`: each accept rule counts what it let in (the first packet
    of each connection; the rest are accepted as established)."""
    found = json.loads(_nft(node, "-j", "list", "chain", "inet", TABLE, "input"))
    out = []
    for item in found.get("nftables", []):
        rule = item.get("rule")
        if not rule or "comment" not in rule:
            continue
        packets = sum(e["counter"].get("packets", 0) for e in rule.get("expr", []) if isinstance(e, dict) and "counter" in e)
        if packets:
            out.append({"opening": rule["comment"], "packets": packets})
    return out


@dataclass(frozen=True)
class Refusal:
    """A connection the rules refused: from `source` (the roles placed there) to `destination`
    (the roles placed there) on `port`, with the fix: the plan entry to add or widen."""

    source: str
    clients: tuple[str, ...]
    destination: str
    listeners: tuple[str, ...]
    port: int
    fix: str

    @property
    def message(self) -> str:
        client = "/".join(self.clients) or "an address no role is placed on"
        listener = "/".join(self.listeners) or "an address no role is placed on"
        return (f"role {client} ({self.source}) connected to {listener} ({self.destination}) port {self.port}, "
                f"which the plan does not open")

    def to_dict(self) -> dict:
        return {"source": self.source, "clients": list(self.clients), "destination": self.destination,
                "listeners": list(self.listeners), "port": self.port, "message": self.message, "fix": self.fix}


def _fix(plan: Sequence[Opening], clients: Sequence[str], listeners: Sequence[str], port: int) -> str:
    client, listener = "/".join(clients) or "<client role>", "/".join(listeners) or "<listening role>"
    for o in plan:
        if o.listener in listeners and o.first <= port <= o.last:
            where = f"the plan's opening {o.listener} {o.ports} ({o.purpose}, key {o.key or 'fixed port'})"
            if o.reach != CLUSTER:
                return (f"{where} has reach {o.reach}: when {client} and {o.listener} run on different nodes it must be "
                        f"{CLUSTER} with {client} among its clients ({PLAN_FILE})")
            return f"add {client} to the clients of {where} in {PLAN_FILE}"
    return (f"add an opening to the plan in {PLAN_FILE}: listener {listener}, port {port}, client {client}, reach {CLUSTER}, "
            f"with the config key that sets port {port}")


def refusals(nodes: Iterable[Node], plan: Sequence[Opening], placement: Mapping[str, Sequence[str]]) -> list[Refusal]:
    """Every connection refused on `nodes`, named by role and port, each with the plan entry to add."""
    def roles_at(address: str) -> tuple[str, ...]:
        return tuple(sorted(r for r, addrs in placement.items() if address in addrs))

    out = []
    for node in nodes:
        listeners = roles_at(node.address)
        for source, port in refused(node):
            clients = roles_at(source)
            out.append(Refusal(source, clients, node.address, listeners, port, _fix(plan, clients, listeners, port)))
    return out


def check(found: Sequence[Refusal]) -> Check:
    """Pass when no node refused a connection; a failure names each role, port and plan entry to add."""
    return Check.judge("firewall: roles use only planned ports", not found, [r.to_dict() for r in found],
                       "no connection between nodes outside the plan's openings",
                       "; ".join(f"{r.message}: {r.fix}" for r in found),
                       detail="\n".join(r.message for r in found))
