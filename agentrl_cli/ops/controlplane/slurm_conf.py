"""slurm.conf text for the configured pools: the partition and license lines an administrator adds to
a cluster's slurm.conf, and a whole config (no slurmdbd): for one box and for CI (`single_node_conf`,
one node named localhost), or for a controller and named compute nodes (`cluster_conf`, which the
rehearsal's simulated nodes use, `agentrl_cli/ops/rehearse/slurm.py`).

How the pool keys land in Slurm: a pool is a partition; `priority` is its PriorityTier; `preemptible`
is PreemptMode=REQUEUE (else OFF), with cluster-wide PreemptType=preempt/partition_prio; `capacity`
is MaxCPUsPerNode; `quota` is a license `<pool>_jobs` with that count, one of which every job of
the pool holds while it runs; a partition lets a job span `cluster.nodes` nodes (MaxNodes), so the
training job (`agentrl job submit --training`: sbatch --nodes=cluster.nodes) fits. All of this works
without slurmdbd (QOS limits would need it).

`network_notes` follows the slurm.conf lines as `#` comments: the ports each node role must open to
the others and out, and the paths they must share, from the cross-node plan (`agentrl_cli/ops/netplan.py`,
layout hosts), the same list `agentrl plan` prints.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentrl_cli.config.models import ControlPlaneConfig, PlatformConfig
from agentrl_cli.ops.netplan import CLUSTER, EPHEMERAL_NAME, HOSTS, OUTSIDE, openings, shared_paths, warnings

HEADER = """\
# {title} (no slurmdbd): partitions = agentrl pools
ClusterName=agentrl
SlurmctldHost={controller}
SlurmUser={slurm_user}
AuthType=auth/munge
CredType=cred/munge
# requeued jobs become eligible again after cred_expire seconds (default 120)
AuthInfo=cred_expire=10{munge_socket}
MailProg=/bin/true
MpiDefault=none
StateSaveLocation={state_dir}/slurmctld
SlurmdSpoolDir={state_dir}/slurmd{per_node}
SlurmctldPidFile={run_dir}/slurmctld.pid
SlurmdPidFile={run_dir}/slurmd{per_node}.pid
SlurmctldLogFile={log_dir}/slurmctld.log
SlurmdLogFile={log_dir}/slurmd{per_node}.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={log_dir}/jobcomp.log
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# the node may advertise more CPUs than the machine has
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=300
SchedulerParameters=sched_interval=2,bf_interval=2
"""


@dataclass(frozen=True)
class SlurmHost:
    """A host of the cluster as slurm.conf names it: its Slurm node name (also its hostname) and its address."""

    name: str
    address: str


LOCALHOST = SlurmHost("localhost", "127.0.0.1")


def license_name(pool: str) -> str:
    return f"{pool}_jobs"


def pool_lines(cp: ControlPlaneConfig, nodes: str = "ALL", max_nodes: int = 1) -> list[str]:
    """PreemptType, Licenses and one PartitionName line per pool (highest tier first); a job of any
    pool may span `max_nodes` nodes (the training job spans cluster.nodes)."""
    lines = ["PreemptType=preempt/partition_prio", "PreemptMode=REQUEUE",
             "Licenses=" + ",".join(f"{license_name(p.name)}:{p.quota}" for p in cp.pools)]
    default = cp.pools[0].name
    for p in sorted(cp.pools, key=lambda p: -p.priority):
        mode = "REQUEUE" if p.preemptible else "OFF"
        lines.append(f"PartitionName={p.name} Nodes={nodes}{' Default=YES' if p.name == default else ''} "
                     f"MaxNodes={max_nodes} MaxCPUsPerNode={p.capacity} PriorityTier={p.priority} PreemptMode={mode} State=UP")
    return lines


def single_node_conf(cp: ControlPlaneConfig, *, cpus: int | None = None, state_dir: str = "/var/lib/slurm",
                     run_dir: str = "/run/slurm", log_dir: str = "/var/log/slurm", slurm_user: str = "slurm") -> str:
    """A whole slurm.conf for one node named localhost (127.0.0.1). The node advertises as many CPUs as the
    largest pool, so pools compete for it and a higher tier's job can preempt a lower tier's."""
    return cluster_conf(cp, cpus=cpus, state_dir=state_dir, run_dir=run_dir, log_dir=log_dir, slurm_user=slurm_user)


def cluster_conf(cp: ControlPlaneConfig, *, controller: SlurmHost = LOCALHOST, nodes: tuple[SlurmHost, ...] = (LOCALHOST,),
                 cpus: int | None = None, state_dir: str = "/var/lib/slurm", run_dir: str = "/run/slurm",
                 log_dir: str = "/var/log/slurm", slurm_user: str = "slurm", munge_socket: str = "") -> str:
    """A whole slurm.conf: slurmctld on `controller`, one slurmd per node of `nodes` (each advertising
    `cpus`, default the largest pool's capacity), every partition on all of them and open to jobs that
    span them all. With several nodes the slurmd spool, pid and log paths carry the node's name (`%n`),
    so nodes that share a file system (simulated nodes on one machine) keep them apart; `munge_socket`
    names munged's socket when it is not the default one. With the defaults this is `single_node_conf`."""
    cpus = cpus or max(p.capacity for p in cp.pools)
    several = len(nodes) > 1
    title = (f"Slurm config written by agentrl for {len(nodes)} nodes" if several else "Single-node Slurm config written by agentrl")
    head = HEADER.format(title=title, controller=_host(controller), slurm_user=slurm_user, state_dir=state_dir,
                         run_dir=run_dir, log_dir=log_dir, per_node=".%n" if several else "",
                         munge_socket=f",socket={munge_socket}" if munge_socket else "")
    names = ",".join(n.name for n in nodes)
    pools = pool_lines(cp, nodes=names, max_nodes=len(nodes))
    node_lines = [f"NodeName={n.name} NodeAddr={n.address} CPUs={cpus} RealMemory=2000 State=UNKNOWN" for n in nodes]
    return head + "\n".join([*pools[:3], *node_lines, *pools[3:]]) + "\n"


def _host(host: SlurmHost) -> str:
    """SlurmctldHost's value: the name, with the address in parentheses unless the name is localhost."""
    return host.name if host == LOCALHOST else f"{host.name}({host.address})"


def network_notes(cfg: PlatformConfig) -> list[str]:
    """`#` lines: each port (or range) a node role opens to the others or out, and each shared path."""
    cfg = on_slurm(cfg)
    plan = openings(cfg, HOSTS)
    lines = ["# agentrl network: what each node role must let in from the others (`agentrl plan` says why); "
             f"{EPHEMERAL_NAME}"]
    between = [o for o in plan if o.reach == CLUSTER]
    for o in between:
        lines.append(f"# {o.listener} <- {', '.join(o.clients) or 'operators'}: {o.protocol} {o.ports}: {o.purpose}"
                     + (f" ({o.key})" if o.key else ""))
    if not between:
        lines.append("# (none: every listener of this config is on loopback)")
    for o in plan:
        if o.reach == OUTSIDE:
            lines.append(f"# outbound: {', '.join(o.clients)} -> {o.listener} {o.note}: {o.protocol} {o.ports}: {o.purpose} ({o.key})")
    for p in shared_paths(cfg, HOSTS):
        if p.shared:
            written = f"written by {', '.join(p.writers)}, " if p.writers else ""
            lines.append(f"# shared filesystem: {p.path}: {p.what}, {written}read by {', '.join(p.readers)} ({p.key})")
    lines += [f"# warning: {w}" for w in warnings(cfg, HOSTS)]
    return lines


def on_slurm(cfg: PlatformConfig) -> PlatformConfig:
    """`cfg` with controlplane.executor slurm (what its jobs share depends on it)."""
    return cfg.model_copy(update={"controlplane": cfg.controlplane.model_copy(update={"executor": "slurm"})})
