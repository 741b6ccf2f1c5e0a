"""Slurm across simulated nodes: slurmctld on a node of its own, one slurmd per compute node (`slurmd
-N <node>`), one munged whose socket every node reaches (a socket is a path in the file system, which
network namespaces share), and a slurm.conf rendered by agentrl for that topology
(`slurm_conf.cluster_conf`, followed by the `#` notes `agentrl controlplane render --executor slurm`
prints). Client commands (sbatch, squeue, sinfo, srun) find it through SLURM_CONF: run them in a node
with `SlurmCluster.client(cmd)`, since the host's network namespace has no route to the nodes.

Every file (the config, the munge key and socket, slurmctld's state, each slurmd's spool, the logs)
lives in the run's own directory (`network.record.files`), and every daemon is started in a node
(`Node.popen`), so the network's teardown, or `leftovers.reclaim()` after its owner was killed,
removes all of it; the machine's own Slurm (/etc/slurm, /run/munge) is never read or touched.

Belongs here: starting Slurm's daemons on simulated nodes and waiting until they serve. Does not:
the config's text (`ops/controlplane/slurm_conf.py`), submitting jobs (`ops/controlplane/slurm.py`),
making or removing nodes (`nodes.py`, `leftovers.py`).
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

from agentrl_cli.config.models import PlatformConfig
from agentrl_cli.core.errors import AgentrlError, UsageError
from agentrl_cli.ops.controlplane.slurm_conf import SlurmHost, cluster_conf, network_notes
from agentrl_cli.ops.rehearse.nodes import Node

DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "slurmstepd", "setpriv")
CLIENTS = ("munge", "unmunge", "sbatch", "squeue", "sinfo", "srun", "scontrol", "scancel")
USERS = ("slurm", "munge")
SBIN = "/usr/sbin:/sbin"
# `ip netns exec` mounts a fresh /sys in the node, without the cgroup file systems, and slurmd will not
# start without them (it loads its cgroup plugin even with proctrack/linuxproc and task/none, which use
# none). So each slurmd's shell mounts one first: the unified hierarchy where the host has cgroup v2,
# else a tmpfs holding a named v1 hierarchy of its own, no controllers (what slurmd's v1 plugin checks
# for). The mounts are in the node's private mount namespace: they end with slurmd, the host never sees them.
CGROUP_V2 = 'mount -t cgroup2 agrl-cgroup /sys/fs/cgroup && exec "$@"'
CGROUP_V1 = ('mount -t tmpfs -o mode=755 agrl-cgroup /sys/fs/cgroup && mkdir /sys/fs/cgroup/systemd && '
             'mount -t cgroup -o none,name=agrl-slurmd agrl-cgroup /sys/fs/cgroup/systemd && exec "$@"')


class SlurmUnavailable(AgentrlError):
    """Slurm cannot be started on simulated nodes here (not installed, or its users missing); the hint says how to fix it."""


class SlurmNotReady(AgentrlError):
    """Slurm's daemons were started on the simulated nodes but did not come up in time; the message names the logs."""


def unavailable() -> SlurmUnavailable | None:
    """Why Slurm cannot run on simulated nodes here, as an error carrying the fix; None when it can."""
    missing = [b for b in (*DAEMONS, *CLIENTS) if _which(b) is None]
    users = [u for u in USERS if not _user(u)]
    if missing or users:
        what = ", ".join(missing + [f"user {u}" for u in users])
        return SlurmUnavailable(f"Slurm across simulated nodes needs {what}, not found",
                                "apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge")
    return None


@dataclass(frozen=True)
class SlurmCluster:
    """A running Slurm on simulated nodes: its controller node, its compute nodes and its files."""

    controller: Node
    nodes: tuple[Node, ...]
    root: Path  # the cluster's directory inside the run's files

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.root / "munge" / "munge.socket"

    @property
    def logs(self) -> Path:
        return self.root / "log"

    def client(self, cmd: Sequence[str]) -> list[str]:
        """`cmd` with SLURM_CONF naming this cluster's config: pass it to `Node.run` or `Node.popen`."""
        return ["env", f"SLURM_CONF={self.conf}", *[str(c) for c in cmd]]

    def states(self) -> dict[str, str]:
        """Each compute node's state as `sinfo` reports it (idle, alloc, down, ...), asked from the controller's node."""
        done = self.controller.run(self.client(["sinfo", "-h", "-N", "-o", "%N %t"]), timeout=30)
        pairs = (line.split() for line in done.stdout.splitlines())
        return {p[0]: p[1] for p in pairs if len(p) == 2} if done.returncode == 0 else {}


def start(cfg: PlatformConfig, controller: Node, nodes: Sequence[Node], *, deadline_s: float = 60.0) -> SlurmCluster:
    """Start munged and slurmctld on `controller` and a slurmd on each of `nodes` (all of one network;
    once per network), with a slurm.conf agentrl renders from `cfg` for them; return once `sinfo` shows every node idle.
    Raises SlurmUnavailable when Slurm is not installed, SlurmNotReady (naming the logs) past `deadline_s`."""
    problem = unavailable()
    if problem is not None:
        raise problem
    if not nodes or any(n.network is not controller.network or n.name == controller.name for n in nodes):
        raise UsageError("Slurm's compute nodes must be nodes of the controller's network, at least one, none the controller",
                         "add the nodes with network.add_node(name) and pass them, e.g. start(cfg, slurmctld_0, [trainer_0, trainer_1])")
    cluster = SlurmCluster(controller, tuple(nodes), controller.network.record.files / "slurm")
    _write_files(cfg, cluster)
    until = time.monotonic() + deadline_s
    munge = cluster.munge_socket.parent
    _daemon(controller, cluster, "munged", ["setpriv", "--reuid=munge", "--regid=munge", "--clear-groups", _which("munged"),
                                            "--foreground", f"--socket={cluster.munge_socket}", f"--key-file={munge}/munge.key",
                                            f"--pid-file={munge}/munged.pid", f"--seed-file={munge}/munged.seed",
                                            f"--log-file={munge}/munged.log"])
    _wait(lambda: _munge_works(cluster.munge_socket), until, "munged to answer on its socket", cluster)
    _daemon(controller, cluster, "slurmctld", [_which("slurmctld"), "-D", "-i", "-f", str(cluster.conf)])
    for node in cluster.nodes:
        _daemon(node, cluster, f"slurmd.{node.name}", ["/bin/sh", "-c", _cgroup_mount(), "agrl-slurmd", _which("slurmd"), "-D",
                                                        "-N", node.name, "-f", str(cluster.conf)])
    names = {n.name for n in cluster.nodes}
    _wait(lambda: names <= {n for n, s in cluster.states().items() if s == "idle"}, until,
          f"sinfo to show {', '.join(sorted(names))} idle", cluster)
    return cluster


def _write_files(cfg: PlatformConfig, cluster: SlurmCluster) -> None:
    """The config, the munge key and the directories the daemons write, owned by the users they run as."""
    root, munge = cluster.root, cluster.munge_socket.parent
    spools = [(root / "state" / f"slurmd.{n.name}", "root") for n in cluster.nodes]  # slurm.conf's slurmd.%n
    for d, owner in [(root, "root"), (munge, "munge"), (root / "state", "slurm"), (root / "state" / "slurmctld", "slurm"),
                     (root / "run", "slurm"), (cluster.logs, "slurm"), *spools]:
        d.mkdir(mode=0o755)
        shutil.chown(d, owner, owner)
        d.chmod(0o755)
    subprocess.run([_which("mungekey"), "--create", f"--keyfile={munge}/munge.key"], check=True, capture_output=True, timeout=30)
    shutil.chown(munge / "munge.key", "munge", "munge")
    (munge / "munge.key").chmod(0o400)
    conf = cluster_conf(cfg.controlplane, controller=SlurmHost(cluster.controller.name, cluster.controller.address),
                        nodes=tuple(SlurmHost(n.name, n.address) for n in cluster.nodes), state_dir=str(root / "state"),
                        run_dir=str(root / "run"), log_dir=str(cluster.logs), munge_socket=str(cluster.munge_socket))
    cluster.conf.write_text(conf + "\n".join(network_notes(cfg)) + "\n", encoding="utf-8")


def _daemon(node: Node, cluster: SlurmCluster, name: str, argv: list[str]) -> None:
    """Start a daemon in the foreground in `node`, its output in the cluster's log directory."""
    with open(cluster.logs / f"{name}.out", "ab") as out:
        node.popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env={**os.environ, "SLURM_CONF": str(cluster.conf)})


def _cgroup_mount() -> str:
    """The shell that mounts a cgroup file system in a node and then runs its arguments."""
    host = subprocess.run(["stat", "-f", "-c", "%T", "/sys/fs/cgroup"], capture_output=True, text=True, timeout=10).stdout
    return CGROUP_V2 if host.strip() == "cgroup2fs" else CGROUP_V1


def _munge_works(socket: Path) -> bool:
    cred = subprocess.run([_which("munge"), "-n", "-S", str(socket)], capture_output=True, timeout=10)
    return cred.returncode == 0 and subprocess.run([_which("unmunge"), "-S", str(socket)], input=cred.stdout,
                                                   capture_output=True, timeout=10).returncode == 0


def _wait(ok, until: float, what: str, cluster: SlurmCluster) -> None:
    while True:
        if ok():
            return
        if time.monotonic() > until:
            raise SlurmNotReady(f"timed out waiting for {what} on the simulated nodes",
                                f"read the daemons' logs in {cluster.logs} and {cluster.munge_socket.parent}/munged.log")
        time.sleep(0.25)


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path=SBIN)


def _user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False
