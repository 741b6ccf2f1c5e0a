"""Trainer nodes for the `deepspeed` launcher's multi-node path: simulated nodes (`nodes.py`) on which
`launcher_command` (learner/ranks_backend.py, `cluster.nodes` > 1) works as on a cluster. The
launcher, on the first node, checks `ssh -o PasswordAuthentication=no HOST hostname`, then starts
every node's ranks (its own too) with `pdsh -S -f 1024 -w HOSTS ...` over ssh, and the ranks meet on
`training.master_port` of the first host.

`add_trainers(network, names)` makes, in the network's run files (`<files>/ssh/`): a fresh ed25519
client key and host key, their authorized_keys, one sshd configuration per node (its address, port
22, root by key only, no PAM, its pid file and log here), a client configuration (that key, no host
key checks, no prompts) and the hostfile (`NAME slots=N`). Each node is added with mounts of its
own: the client configuration over /etc/ssh/ssh_config, an empty directory over root's ~/.ssh when
the host has one (so nothing there applies), and an empty directory as sshd's privilege separation
directory /run/sshd (created on the host when missing, and removed with the run; a second rehearsal
running at the same time shares it). None of these mounts is seen outside the nodes, and the host's
/etc/ssh and ~/.ssh are never written. `TrainerNodes.start_sshd()` starts `sshd -D -e` in each node
with `Node.popen`, so a teardown (or a later reclaim) kills it and every session it started, and
waits, with a deadline, until each says it listens and the first node reaches every node as the
launcher will. `TrainerNodes.env` is what the caller adds to the launcher's environment: the
hostfile (DLTS_HOSTFILE) and gloo's interface (GLOO_SOCKET_IFNAME=eth0, the nodes' one link).

Belongs here: what sshd and ssh need between trainer nodes, and the hostfile. Does not: the
launcher's command line or the ranks' environment (`learner/ranks_backend.py`), the firewall
(`firewall.py`), making nodes (`nodes.py`).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from agentrl_cli.ops.rehearse.host import NodesUnavailable
from agentrl_cli.ops.rehearse.host import unavailable as nodes_unavailable
from agentrl_cli.ops.rehearse.nodes import Network, Node

SSH_PORT = 22
PRIVSEP_DIR = Path("/run/sshd")  # compiled into sshd: it refuses to start without it
CLIENT_CONFIG = Path("/etc/ssh/ssh_config")
TOOLS = {"sshd": "openssh-server", "ssh": "openssh-client", "ssh-keygen": "openssh-client", "pdsh": "pdsh"}
SBIN = "/usr/local/sbin:/usr/sbin:/sbin"
GLOO_IFNAME = "eth0"
HOSTFILE_ENV = "DLTS_HOSTFILE"  # the `deepspeed` launcher's variable (learner/ranks_backend.py reads it too)


def _which(tool: str) -> str | None:
    return shutil.which(tool, path=f"{os.environ.get('PATH', '')}:{SBIN}")


def unavailable() -> NodesUnavailable | None:
    """Why trainer nodes cannot be made here (no simulated nodes, sshd, ssh or pdsh); None when they can."""
    problem = nodes_unavailable()
    missing = [tool for tool in TOOLS if _which(tool) is None]
    if problem is None and missing:
        packages = " ".join(sorted({TOOLS[t] for t in missing}))
        problem = NodesUnavailable(f"trainer nodes need {', '.join(missing)}, not found on PATH or in {SBIN}",
                                   f"install them: apt-get install -y {packages}")
    if problem is None and not CLIENT_CONFIG.is_file():
        problem = NodesUnavailable(f"{CLIENT_CONFIG} does not exist: the nodes mount their ssh client configuration over it",
                                   "install openssh-client: apt-get install -y openssh-client")
    return problem


CLIENT = """Host *
    User root
    IdentityFile {key}
    IdentitiesOnly yes
    BatchMode yes
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null
    GlobalKnownHostsFile /dev/null
    ConnectTimeout 10
    LogLevel ERROR
"""
SERVER = """ListenAddress {address}:{port}
HostKey {host_key}
AuthorizedKeysFile {authorized}
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
StrictModes no
UsePAM no
PrintMotd no
PidFile {pid}
"""


@dataclass(frozen=True)
class TrainerNodes:
    """Trainer nodes with their ssh files; `start_sshd()` makes them reachable, `env` points the launcher at them."""

    nodes: tuple[Node, ...]
    slots: int
    ssh_dir: Path
    hostfile: Path

    @property
    def hosts(self) -> list[str]:
        return [n.name for n in self.nodes]

    @property
    def env(self) -> dict[str, str]:
        """What the launcher's environment needs on the first node: the hostfile, and gloo on the nodes' link
        (gloo otherwise binds the address its hostname resolves to, on many hosts 127.0.1.1)."""
        return {HOSTFILE_ENV: str(self.hostfile), "GLOO_SOCKET_IFNAME": GLOO_IFNAME}

    def log(self, node: Node) -> Path:
        return self.ssh_dir / f"sshd-{node.name}.log"

    def start_sshd(self, timeout_s: float = 30.0) -> list[subprocess.Popen]:
        """Start sshd in every node and wait until each listens and the first node reaches each with
        the launcher's own check; past `timeout_s` (or when an sshd exits) NodesUnavailable names the node."""
        sshd = _which("sshd")
        procs = []
        for node in self.nodes:
            with open(self.log(node), "ab") as log:
                procs.append(node.popen([sshd, "-D", "-e", "-f", str(self.ssh_dir / f"sshd-{node.name}.conf")],
                                        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + timeout_s
        for node, proc in zip(self.nodes, procs):
            self._wait_listening(node, proc, deadline)
        self._check_reach(deadline)
        return procs

    def _wait_listening(self, node: Node, proc: subprocess.Popen, deadline: float) -> None:
        said = f"Server listening on {node.address} port {SSH_PORT}"
        while said not in self.log(node).read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                why = f"exited with status {proc.returncode}" if proc.returncode is not None else "did not listen in time"
                raise NodesUnavailable(f"sshd on node {node.name} {why}; {self.log(node)} ends with:\n"
                                       f"{self.log(node).read_text(errors='replace')[-2000:]}",
                                       "see sshd's message; `agentrl sandbox reclaim` removes what a failed rehearsal left")
            time.sleep(0.05)

    def _check_reach(self, deadline: float) -> None:
        """`ssh -o PasswordAuthentication=no HOST hostname` from the first node to every node, as the launcher checks."""
        first = self.nodes[0]
        script = "for h in \"$@\"; do ssh -o PasswordAuthentication=no \"$h\" hostname || exit $?; done"
        try:
            done = first.run(["sh", "-c", script, "reach", *self.hosts], timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise NodesUnavailable(f"node {first.name} did not reach every trainer node {self.hosts} by ssh in time",
                                   f"see the sshd logs in {self.ssh_dir}") from None
        if done.returncode != 0 or done.stdout.split() != self.hosts:
            raise NodesUnavailable(f"node {first.name} cannot ssh to every trainer node {self.hosts}: status {done.returncode}, "
                                   f"printed {done.stdout.split()}, stderr: {done.stderr.strip()[-1000:]}",
                                   f"see the sshd logs in {self.ssh_dir}")


def _keygen(path: Path) -> None:
    subprocess.run([_which("ssh-keygen"), "-q", "-t", "ed25519", "-N", "", "-C", "agentrl-rehearsal", "-f", str(path)],
                   check=True, capture_output=True, timeout=30)


def _write(path: Path, text: str, mode: int = 0o600) -> None:
    path.touch(mode=mode)
    path.write_text(text)


def add_trainers(network: Network, names: Sequence[str] = ("trainer-0", "trainer-1"), slots: int = 1) -> TrainerNodes:
    """Add trainer nodes `names` to `network`, each with `slots` ranks in the hostfile, and write
    what their sshd and ssh need; start sshd with `start_sshd()` (after any firewall rules)."""
    problem = unavailable()
    if problem is not None:
        raise problem
    ssh = network.record.files / "ssh"
    ssh.mkdir(mode=0o700)
    key, host_key = ssh / "id_ed25519", ssh / "host_ed25519"
    _keygen(key)
    _keygen(host_key)
    _write(ssh / "authorized_keys", Path(f"{key}.pub").read_text())
    _write(ssh / "ssh_config", CLIENT.format(key=key), 0o644)
    for empty in ("privsep", "dot-ssh"):
        (ssh / empty).mkdir(mode=0o755)
    mounts = {str(CLIENT_CONFIG): ssh / "ssh_config", str(PRIVSEP_DIR): ssh / "privsep"}
    home_ssh = Path(pwd.getpwuid(0).pw_dir) / ".ssh"
    if home_ssh.is_dir():
        mounts[str(home_ssh)] = ssh / "dot-ssh"
    nodes = tuple(network.add_node(name, mounts=mounts) for name in names)
    for node in nodes:
        _write(ssh / f"sshd-{node.name}.conf", SERVER.format(address=node.address, port=SSH_PORT, host_key=host_key,
                                                           authorized=ssh / "authorized_keys", pid=ssh / f"sshd-{node.name}.pid"))
    hostfile = network.record.files / "hostfile"
    _write(hostfile, "".join(f"{node.name} slots={slots}\n" for node in nodes), 0o644)
    return TrainerNodes(nodes, slots, ssh, hostfile)
