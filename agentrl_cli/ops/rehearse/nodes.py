"""Simulated nodes on one machine: a `Network` is a switch (a network namespace of its own holding a
Linux bridge) and its `Node`s, each a network namespace whose one interface, `eth0`, is a veth pair's
end; the other end lives in the switch namespace, enslaved to the bridge. Nothing is made in the
host's network namespace (no veth end, no bridge, no route), and no node has a route out: a node
knows its subnet (from the benchmarking range 198.18.0.0/15, RFC 2544) and nothing else.

A process started in a node (`Node.popen`, `Node.run`) runs with `ip netns exec` in the node's
network namespace, in a new UTS namespace (its hostname is the node's name) and a private mount
namespace where the network's /etc/hosts (every node's name and address) and the shared paths (the
plan's runs volume, weight exports, checkpoints, model: host directories), and the node's own
mounts (`add_node(name, mounts=...)`: a generated file or directory over a host path, e.g. a client
configuration), are bind-mounted; none of these mounts is visible outside it, and they end with it.
Everything else is the host's file system: a node is a network, a name and a set of mounts, not a
container.

Every namespace is named `agrl-<run id>-<name>` and recorded (`record.py`) before it is made, with
every process started in it, so `teardown()` here, or `leftovers.reclaim()` in a later process after
this one was killed, removes all of it.

Belongs here: making a network and its nodes, starting processes in them. Does not: removing
(`leftovers.py`), host facts (`host.py`), firewall rules between nodes (`firewall.py`).
"""

from __future__ import annotations

import ipaddress
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from agentrl_cli.core.errors import UsageError
from agentrl_cli.ops.rehearse.host import NETNS_DIR, ip, is_mountpoint, proc_start, unavailable
from agentrl_cli.ops.rehearse.leftovers import remove
from agentrl_cli.ops.rehearse.record import STATE_DIR, RunRecord

BENCHMARKING = ipaddress.ip_network("198.18.0.0/15")
NODE_NAME = re.compile(r"^[a-z][a-z0-9-]{0,30}$")
SWITCH = "switch"
# Run by /bin/sh inside the node's new UTS and mount namespaces: $1 hostname, $2 hosts file, $3 the
# number of (source, target) pairs that follow, then the command, which replaces the shell.
LAUNCH = """set -e
hostname "$1"; mount --bind "$2" /etc/hosts; n="$3"; shift 3
while [ "$n" -gt 0 ]; do mount --bind "$1" "$2"; shift 2; n=$((n - 1)); done
exec "$@"
"""


@dataclass(frozen=True)
class Node:
    """One simulated node: its name (also its hostname), its namespace and its address."""

    network: Network
    name: str
    netns: str
    address: str
    prefixlen: int
    mounts: tuple[tuple[str, str], ...] = ()  # (target, source) bind-mounted in this node only, after the shared paths

    @property
    def hostname(self) -> str:
        return self.name

    def argv(self, cmd: Sequence[str]) -> list[str]:
        """The command line that runs `cmd` inside this node."""
        pairs = [*self.network.shared.items(), *self.mounts]
        binds = [str(x) for target, source in pairs for x in (source, target)]
        return ["ip", "netns", "exec", self.netns, "unshare", "--uts", "--mount", "--propagation", "private", "--",
                "/bin/sh", "-c", LAUNCH, "agrl-node", self.name, str(self.network.hosts_file),
                str(len(pairs)), *binds, *[str(c) for c in cmd]]

    def popen(self, cmd: Sequence[str], **kwargs) -> subprocess.Popen:
        """Start `cmd` inside this node (keyword arguments as subprocess.Popen's); the network records
        it, and its teardown (or a later reclaim) kills it."""
        proc = subprocess.Popen(self.argv(cmd), **kwargs)
        self.network._started(proc)
        return proc

    def run(self, cmd: Sequence[str], *, timeout: float = 60.0, check: bool = False, input: str | None = None,
            capture_output: bool = True, text: bool = True, env: Mapping[str, str] | None = None,
            cwd: str | Path | None = None) -> subprocess.CompletedProcess:
        """Run `cmd` inside this node to its end, as subprocess.run does; past `timeout` it is killed
        and TimeoutExpired raised, carrying what it had written (`output`, `stderr`)."""
        pipe = subprocess.PIPE if capture_output else None
        with self.popen(cmd, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                        stdout=pipe, stderr=pipe, text=text, env=env, cwd=cwd) as proc:
            try:
                out, err = proc.communicate(input, timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
                raise subprocess.TimeoutExpired(proc.args, timeout, output=out, stderr=err) from None
        done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        if check:
            done.check_returncode()
        return done


class Network:
    """A switch and its nodes. Build with `Network.create(...)`, add nodes with `add_node(name)`,
    end with `teardown()` (or use it as a context manager)."""

    def __init__(self, record: RunRecord, subnet: ipaddress.IPv4Network, shared: dict[str, str]) -> None:
        self.record = record
        self.subnet = subnet
        self.shared = shared
        self.nodes: dict[str, Node] = {}
        self._procs: list[subprocess.Popen] = []
        self._closed = False

    @classmethod
    def create(cls, *, subnet: str = "198.18.0.0/24", shared: Mapping[str, str | Path] | None = None,
               state_dir: Path = STATE_DIR) -> Network:
        """A new switch with no nodes. `shared` maps a path every node sees to the host directory
        bind-mounted there; a missing mount point is created (and removed at teardown)."""
        net_range, paths = subnet_of(subnet), _shared(shared or {})
        problem = unavailable()
        if problem is not None:
            raise problem
        net = cls(RunRecord.new(Path(state_dir)), net_range, paths)
        try:
            net._build()
        except BaseException:
            net.teardown()
            raise
        return net

    @property
    def run_id(self) -> str:
        return self.record.run

    @property
    def switch(self) -> str:
        return self.record.netns(SWITCH)

    @property
    def hosts_file(self) -> Path:
        return self.record.files / "hosts"

    def _build(self) -> None:
        rec = self.record
        rec.netns_dir_made = not NETNS_DIR.exists()
        rec.netns_mount_made = not is_mountpoint(NETNS_DIR)
        rec.made_dirs.append(str(rec.files))
        rec.made_dirs.extend(_missing(Path(t) for t in self.shared))
        rec.mount_points.extend(self.shared)
        rec.namespaces.append(self.switch)
        rec.save()
        for d in rec.made_dirs:
            Path(d).mkdir(exist_ok=True)
        self._write_hosts()
        ip("netns", "add", self.switch)
        ip("link", "set", "lo", "up", netns=self.switch)
        ip("link", "add", "br0", "type", "bridge", netns=self.switch)
        ip("link", "set", "br0", "up", netns=self.switch)

    def add_node(self, name: str, mounts: Mapping[str, str | Path] | None = None) -> Node:
        """A new node named `name` (its hostname), with the subnet's next address, plugged into the switch.
        `mounts` maps a path only this node's processes see to the host file or directory bind-mounted
        there; a missing mount point of a directory is created (and removed at teardown), a file's
        must exist."""
        if not NODE_NAME.match(name) or name == SWITCH or name in self.nodes:
            raise UsageError(f"bad node name {name!r}: taken, {SWITCH!r}, or not 1-31 of a-z, 0-9 and '-' starting with a letter",
                             "name each node once, e.g. trainer-0, inference-0, sandbox-0")
        index = len(self.nodes)
        hosts = list(self.subnet.hosts())
        if index >= len(hosts):
            raise UsageError(f"subnet {self.subnet} has no address left for node {name!r}", "create the network with a larger subnet")
        own = _own_mounts(mounts or {})
        node = Node(self, name, self.record.netns(name), str(hosts[index]), self.subnet.prefixlen, tuple(own.items()))
        made = [d for d in _missing(Path(t) for t, src in own.items() if Path(src).is_dir()) if d not in self.record.made_dirs]
        self.record.made_dirs.extend(made)
        self.record.mount_points.extend(t for t, src in own.items() if Path(src).is_dir() and t not in self.record.mount_points)
        self.record.namespaces.append(node.netns)
        self.record.save()
        for d in made:
            Path(d).mkdir(exist_ok=True)
        veth = f"v{index}"
        ip("netns", "add", node.netns)
        ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", node.netns, netns=self.switch)
        ip("link", "set", veth, "master", "br0", "up", netns=self.switch)
        ip("link", "set", "lo", "up", netns=node.netns)
        ip("addr", "add", f"{node.address}/{node.prefixlen}", "dev", "eth0", netns=node.netns)
        ip("link", "set", "eth0", "up", netns=node.netns)
        self.nodes[name] = node
        self._write_hosts()
        return node

    def _write_hosts(self) -> None:
        lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost"] + [f"{n.address}\t{n.name}" for n in self.nodes.values()]
        with open(self.hosts_file, "w") as f:  # in place: running nodes' bind mounts keep this inode
            f.write("\n".join(lines) + "\n")

    def _started(self, proc: subprocess.Popen) -> None:
        self._procs.append(proc)
        self.record.processes.append([proc.pid, proc_start(proc.pid)])
        self.record.save()

    def teardown(self) -> dict:
        """Kill every process in the nodes, delete the namespaces (their veths and the bridge go with
        them), remove the files and mount points this run made; returns what was removed."""
        if self._closed:
            return {}
        self._closed = True
        counts = remove(self.record)
        for proc in self._procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                counts["errors"] += 1
        return counts

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *exc) -> None:
        self.teardown()


def subnet_of(text: str) -> ipaddress.IPv4Network:
    try:
        net = ipaddress.ip_network(text)
    except ValueError as exc:
        raise UsageError(f"bad subnet {text!r}: {exc}", "give a network such as 198.18.0.0/24") from None
    if not isinstance(net, ipaddress.IPv4Network) or not net.subnet_of(BENCHMARKING) or net.prefixlen > 30:
        raise UsageError(f"subnet {text} is not a /30 or larger inside the benchmarking range {BENCHMARKING}",
                         "simulated nodes only use 198.18.0.0/15 (RFC 2544), e.g. 198.18.0.0/24")
    return net


def _shared(shared: Mapping[str, str | Path]) -> dict[str, str]:
    out = {}
    for target, source in shared.items():
        if not str(target).startswith("/") or not Path(source).is_dir():
            raise UsageError(f"shared path {target} -> {source}: the target must be absolute and the source an existing directory",
                             "map each path the nodes share to a host directory, e.g. {'/data/runs': '/srv/runs'}")
        out[str(Path(target))] = str(Path(source).resolve())
    return out


def _own_mounts(mounts: Mapping[str, str | Path]) -> dict[str, str]:
    out = {}
    for target, source in mounts.items():
        src = Path(source)
        dest = Path(target)
        ok = str(target).startswith("/") and (src.is_file() and dest.is_file() or src.is_dir() and not dest.is_file())
        if not ok:
            raise UsageError(f"node mount {target} -> {source}: the target must be absolute, the source must exist, and a "
                             "file's target must be an existing file", "mount a generated file over an existing one, or a directory")
        out[str(Path(target))] = str(src.resolve())
    return out


def _missing(targets) -> list[str]:
    """The directories to create for these mount points, parents first."""
    made: list[str] = []
    for target in targets:
        chain = []
        p = target
        while not p.exists():
            chain.append(str(p))
            p = p.parent
        made.extend(d for d in reversed(chain) if d not in made)
    return made
