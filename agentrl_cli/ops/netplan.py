"""The cross-node plan: every port a role listens on that another role or an outside service must
reach, and every path roles share, derived from the config. `agentrl plan` prints it; the
NetworkPolicies (`ops/controlplane/networkpolicies.py`) and the Slurm notes (`ops/controlplane/slurm_conf.py`)
render from it, so a port added here appears in all three.

The same config runs in one of two layouts:
- `hosts` (controlplane.executor local or slurm): a run starts its inference servers on its own host
  (inference.host, ports inference.port, +1, ... and the engine's router after them when there are
  several SGLang or vLLM replicas: `InferenceEngine.ports`) unless inference.urls names servers elsewhere; its gateway on 127.0.0.1;
  reward and sandbox in its own process unless reward.service_url / sandbox.service_url name
  services; its trainer ranks over cluster.nodes hosts (the `deepspeed` launcher, pdsh over ssh).
- `kubernetes`: what `agentrl controlplane render` renders: a pod per server on its Service port
  (`k8s_names.PORTS`; every inference pod on inference.port) and cluster.nodes trainer pods.

Each opening has a reach: `loopback` (this host or pod only: nothing to open), `cluster` (between the
nodes or pods of the deployment), `outside` (a service agentrl does not run: S3, PostgreSQL, the
Kubernetes API server). Ports picked at run time (gloo's and NCCL's connections, the distributed
weight sync's store, a free port) come from the kernel's ephemeral range, net.ipv4.ip_local_port_range:
32768-60999 by Linux default, also in each new network namespace (every pod's) unless the pod sets
that sysctl. Belongs here: what is opened and shared, and why. Rendering is the callers'.
"""

from __future__ import annotations

import ipaddress
import posixpath
from dataclasses import asdict, dataclass
from urllib.parse import urlsplit

from agentrl_cli.config.models import PlatformConfig
from agentrl_cli.engines.engine import SERVER
from agentrl_cli.engines.registry import engine_for
from agentrl_cli.ops.controlplane.k8s_names import PORTS, ROLES, SECRETS_DIR
from agentrl_cli.ops.image.names import HOME, WORKDIR

HOSTS, KUBERNETES = "hosts", "kubernetes"
LOOPBACK, CLUSTER, OUTSIDE = "loopback", "cluster", "outside"
EPHEMERAL = (32768, 60999)
EPHEMERAL_NAME = "ephemeral = the kernel's net.ipv4.ip_local_port_range, 32768-60999 by Linux default"
SSH_PORT = 22  # the `deepspeed` launcher's pdsh connects with ssh's own default port
KUBE_API_PORTS = (443, 6443)
FIXED = "the port the rendered pods pass to --port (k8s_names.PORTS)"
# what an opening is for
RENDEZVOUS, COLLECTIVES, STORE, LAUNCHER = "rendezvous", "collectives", "weight-sync store", "launcher (ssh)"
HTTP, HEALTH, METRICS = "HTTP API", "health", "metrics"
OBJECT_STORE, STATE_STORE, KUBE_API, ALLOWLISTED = "object store (S3)", "state store (PostgreSQL)", "Kubernetes API", "allowlisted endpoint"


@dataclass(frozen=True)
class Opening:
    """`listener` (a role, or an outside service) accepts `protocol` connections on ports first..last
    from `clients` (roles, or `prometheus`) for `purpose`; `key` is the config key that sets the port."""

    listener: str
    first: int
    last: int
    clients: tuple[str, ...]
    purpose: str
    key: str
    reach: str
    protocol: str = "TCP"
    ephemeral: bool = False
    note: str = ""

    @property
    def ports(self) -> str:
        span = str(self.first) if self.first == self.last else f"{self.first}-{self.last}"
        return f"{span} (ephemeral)" if self.ephemeral else span

    def to_dict(self) -> dict:
        return {**asdict(self), "clients": list(self.clients), "ports": self.ports}


@dataclass(frozen=True)
class SharedPath:
    """A path `writers` write and `readers` read; `shared`: it must be the same files on every host
    (or pod) of those roles: a shared filesystem, or for read-only inputs a copy at the same path."""

    what: str
    path: str
    writers: tuple[str, ...]
    readers: tuple[str, ...]
    shared: bool
    key: str
    note: str = ""

    def to_dict(self) -> dict:
        return {**asdict(self), "writers": list(self.writers), "readers": list(self.readers)}


def layout_of(cfg: PlatformConfig, executor: str | None = None) -> str:
    """The layout for `executor` (default controlplane.executor): kubernetes, else hosts."""
    return KUBERNETES if (executor or cfg.controlplane.executor) == "kubernetes" else HOSTS


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host.lower() == "localhost"


def _reach(host: str) -> str:
    return LOOPBACK if _is_loopback(host) else CLUSTER


def _url_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "", parts.port or (80 if parts.scheme == "http" else 443)


def _servers_elsewhere(cfg: PlatformConfig, layout: str) -> bool:
    """Whether the inference servers run on other hosts (pods) than the trainer."""
    return layout == KUBERNETES or any(not _is_loopback(_url_port(u)[0]) for u in cfg.inference.urls)


def _trainer(cfg: PlatformConfig) -> list[Opening]:
    t, nodes = cfg.training, cfg.cluster.nodes
    if nodes > 1:
        return [Opening("trainer", t.master_port, t.master_port, ("trainer",), RENDEZVOUS, "training.master_port", CLUSTER,
                        note="the ranks' TCPStore on the first host of the hostfile"),
                Opening("trainer", SSH_PORT, SSH_PORT, ("trainer",), LAUNCHER, "cluster.nodes", CLUSTER,
                        note="the `deepspeed` launcher starts the other nodes' ranks with pdsh over ssh; each trainer host runs sshd"),
                Opening("trainer", *EPHEMERAL, ("trainer",), COLLECTIVES, "training.dist_backend", CLUSTER, ephemeral=True,
                        note="gloo and NCCL connect every pair of ranks on ports the kernel picks (NCCL over InfiniBand/RoCE bypasses TCP)")]
    if t.world_size > 1:
        return [Opening("trainer", *EPHEMERAL, ("trainer",), RENDEZVOUS, "", LOOPBACK, ephemeral=True,
                        note="one node: a free port on 127.0.0.1 (training.master_port applies when cluster.nodes > 1)"),
                Opening("trainer", *EPHEMERAL, ("trainer",), COLLECTIVES, "training.dist_backend", LOOPBACK, ephemeral=True,
                        note="one node: gloo binds the loopback interface")]
    return []


def _inference(cfg: PlatformConfig, layout: str) -> list[Opening]:
    inf = cfg.inference
    if layout == KUBERNETES:
        return [Opening("inference", inf.port, inf.port, ("trainer", "gateway", "controlplane"), HTTP, "inference.port", CLUSTER,
                        note=f"generation, weight updates and /health; one pod per replica ({inf.replicas}), each on this port; "
                             "the control plane for health checks")]
    if inf.urls:
        out = []
        routed = bool(inf.router_url)
        for url in inf.urls:
            host, port = _url_port(url)
            out.append(Opening("inference", port, port, ("trainer", "inference", "gateway") if routed else ("trainer", "gateway"),
                               HTTP, "inference.urls", _reach(host),
                               note=f"a server this run did not start: {host}" + (
                                   "; weight updates from the trainer, requests from the router (inference.router_url, "
                                   "role inference)" if routed else "") + "; a gateway of its own (`agentrl serve gateway`) generates here"))
        if routed:
            host, port = _url_port(inf.router_url)
            out.append(Opening("inference", port, port, ("trainer", "gateway"), HTTP, "inference.router_url", _reach(host),
                               note=f"the router in front of inference.urls, on {host}: the run's generation requests"))
        return out
    out = []
    for use in engine_for(cfg).ports(inf):  # the engine's servers, then its router when it puts one in front
        note = (f"{inf.replicas} {inf.engine} server(s) the run starts on its host, bound to inference.host {inf.host}"
                if use.role == SERVER else f"{use.what} (port {use.first}: inference.port + inference.replicas)"
                if use.first == inf.port + inf.replicas else f"{use.what} (port {use.first})")
        out.append(Opening("inference", use.first, use.last, ("trainer",), HTTP, "inference.port, inference.replicas",
                           _reach(inf.host), note=note))
    return out


def _weight_sync(cfg: PlatformConfig, layout: str) -> list[Opening]:
    if cfg.training.weight_sync != "distributed":
        return []
    reach = CLUSTER if _servers_elsewhere(cfg, layout) else LOOPBACK
    note = ("the group's store binds the trainer's master address, 127.0.0.1 in weightsync/distributed.py, so servers on "
            "other hosts cannot join it yet (use training.weight_sync: disk there)" if reach == CLUSTER else "")
    return [Opening("trainer", *EPHEMERAL, ("inference",), STORE, "training.weight_sync", reach, ephemeral=True,
                    note=note or "the weight-update group's TCPStore on a free port of the trainer's host"),
            Opening("trainer", *EPHEMERAL, ("inference",), COLLECTIVES, "training.weight_sync", reach, ephemeral=True,
                    note="the weight-update group's broadcast (gloo on CPU, NCCL on GPUs)"),
            Opening("inference", *EPHEMERAL, ("trainer",), COLLECTIVES, "training.weight_sync", reach, ephemeral=True,
                    note="the weight-update group's broadcast (gloo on CPU, NCCL on GPUs)")]


def _services(cfg: PlatformConfig, layout: str) -> list[Opening]:
    if layout == KUBERNETES:
        return [Opening("reward", PORTS["reward"], PORTS["reward"], ("trainer", "controlplane"), HTTP, "", CLUSTER,
                        note=f"scoring (rollout); {FIXED}; health checks from the control plane"),
                Opening("sandbox", PORTS["sandbox"], PORTS["sandbox"], ("trainer", "reward", "controlplane"), HTTP,
                        "", CLUSTER, note=f"environments (rollout) and hidden-test verifiers (reward); {FIXED}; health checks from the control plane"),
                Opening("gateway", PORTS["gateway"], PORTS["gateway"], ("trainer", "sandbox", "controlplane"), HTTP, "",
                        CLUSTER, note=f"sessions (rollout) and agents' chat calls from their sandboxes; {FIXED}; health checks from the control plane"),
                Opening("controlplane", PORTS["controlplane"], PORTS["controlplane"], (), f"{HTTP}, {HEALTH}", "",
                        CLUSTER, note=f"no role calls it: operators (kubectl port-forward) and the kubelet's probes; {FIXED}")]
    out = []
    if cfg.reward.service_url:
        host, port = _url_port(cfg.reward.service_url)
        out.append(Opening("reward", port, port, ("trainer",), HTTP, "reward.service_url", _reach(host)))
    if cfg.sandbox.service_url:
        host, port = _url_port(cfg.sandbox.service_url)
        clients = ("trainer", "reward") if cfg.reward.service_url else ("trainer",)
        out.append(Opening("sandbox", port, port, clients, HTTP, "sandbox.service_url", _reach(host)))
        if cfg.sandbox.replica_url:  # each replica by name: its sandboxes' calls, and the balancer's (role sandbox)
            host, port = _url_port(cfg.sandbox.replica_url.replace("{replica}", "replica"))
            out.append(Opening("sandbox", port, port, (*clients, "sandbox"), HTTP, "sandbox.replica_url",
                               LOOPBACK if _is_loopback(host) else CLUSTER,
                               note="each replica by its name: every call after a sandbox's creation from the clients; "
                                    "creations and health checks from the load balancer at sandbox.service_url (role sandbox)"))
    if _needs_gateway(cfg):
        port = cfg.gateway.port
        out.append(Opening("gateway", *((port, port) if port else EPHEMERAL), ("trainer", "sandbox"), HTTP, "gateway.port", LOOPBACK,
                           ephemeral=not port, note="the run's own gateway on 127.0.0.1; sandboxed agents reach it through their relay"))
    if cfg.controlplane.port:
        port = cfg.controlplane.port
        out.append(Opening("controlplane", port, port, (), f"{HTTP}, {HEALTH}", "controlplane.port", _reach(cfg.controlplane.host),
                           note="no role calls it: operators and probes"))
    return out


def _needs_gateway(cfg: PlatformConfig) -> bool:
    from harnesses.registry import resolve

    return any(getattr(resolve(h.name), "needs_gateway", False) for h in cfg.harnesses)


def _outward(cfg: PlatformConfig, layout: str) -> list[Opening]:
    out = []
    if cfg.data.store == "s3":
        endpoint = cfg.data.s3.endpoint_url or "https://s3.amazonaws.com"
        host, port = _url_port(endpoint)
        out.append(Opening("s3", port, port, ("trainer",), OBJECT_STORE, "data.s3.endpoint_url", OUTSIDE, note=host))
    url = cfg.controlplane.state_store
    if url.startswith("postgres"):
        parts = urlsplit(url)
        port = parts.port or 5432
        out.append(Opening("postgresql", port, port, ("controlplane",), STATE_STORE, "controlplane.state_store", OUTSIDE,
                           note=parts.hostname or ""))
    if layout == KUBERNETES:
        out += [Opening("kubernetes-api", p, p, ("controlplane",), KUBE_API, "", OUTSIDE,
                        note="the cluster's API server (its address is the cluster's own, so any address)") for p in KUBE_API_PORTS]
    for h in cfg.harnesses:
        if h.network != "allowlist":
            continue
        for entry in h.allowlist:
            host, _, port = entry.rpartition(":")
            out.append(Opening(f"allowlisted {host}", int(port), int(port), ("sandbox",), ALLOWLISTED,
                               f"harnesses[{h.name}].allowlist", LOOPBACK if _is_loopback(host) else CLUSTER,
                               note="the sandbox host's relay connects for the sandbox" +
                                    ("" if _is_loopback(host) else "; towards pods in the cluster only")))
    if cfg.observe.prometheus_port:
        port = cfg.observe.prometheus_port
        out.append(Opening("trainer", port, port, ("prometheus",), METRICS, "observe.prometheus_port",
                           _reach(cfg.observe.prometheus_addr), note=f"bound to observe.prometheus_addr {cfg.observe.prometheus_addr}"))
    return out


def gateway_service(cfg: PlatformConfig) -> Opening:
    """The gateway as a service of its own (`agentrl serve gateway --port 8730`, the rendered gateway
    Deployment): sessions from the trainer, agents' chat calls from their sandboxes."""
    port = PORTS["gateway"]
    return Opening("gateway", port, port, ("trainer", "sandbox"), HTTP, "", CLUSTER,
                   note="`agentrl serve gateway` on a host of its own: sessions from the trainer, agents' chat calls from sandboxes")


def openings(cfg: PlatformConfig, layout: str | None = None) -> list[Opening]:
    """Every port a role (or an outside service) listens on for others, in `layout` (default: the config's)."""
    layout = layout or layout_of(cfg)
    return _trainer(cfg) + _inference(cfg, layout) + _weight_sync(cfg, layout) + _services(cfg, layout) + _outward(cfg, layout)


def between_roles(items: list[Opening]) -> list[tuple[Opening, str]]:
    """(opening, client) for each agentrl role that connects to another across nodes (or pods)."""
    return [(o, c) for o in items if o.reach == CLUSTER and o.listener in ROLES for c in o.clients if c in ROLES]


def shared_paths(cfg: PlatformConfig, layout: str | None = None) -> list[SharedPath]:
    """The paths roles write and read, and which must be shared between hosts (pods)."""
    layout = layout or layout_of(cfg)
    t, nodes = cfg.training, cfg.cluster.nodes

    def at(path: str) -> str:  # the rendered pods work in WORKDIR
        return path if layout == HOSTS or path.startswith(("/", "~")) else f"{WORKDIR}/{path}"

    root = at(cfg.observe.runs_dir)
    loop = f"{root.rstrip('/')}/<run id>/<loop>"  # a training loop's directory, e.g. runs/<run id>/stage8
    elsewhere = _servers_elsewhere(cfg, layout)
    out = []
    if t.weight_sync == "disk":
        out.append(SharedPath("weight exports", f"{loop}/weights", ("trainer",), ("inference",), elsewhere,
                              "observe.runs_dir, training.weight_sync", "rank 0 exports each version; every server loads it by this path"))
        if t.lora is not None:
            out.append(SharedPath("adapter exports", f"{loop}/adapters", ("trainer",), ("inference",), elsewhere,
                                  "observe.runs_dir, training.lora", "each version's LoRA adapter; every server loads it by this path"))
    out.append(SharedPath("checkpoints", f"{loop}/checkpoints", ("trainer",), ("trainer",), nodes > 1, "observe.runs_dir",
                          "every rank writes its shards; a restart or resume reads them all"))
    if t.world_size > 1:
        out.append(SharedPath("trainer ranks' control files", f"{loop}/trainer-ranks", ("trainer",), ("trainer",), nodes > 1,
                              "observe.runs_dir", "the training config and channel key every rank reads at start"))
    if cfg.data.store == "local":
        out.append(SharedPath("trajectory store", at(cfg.data.root), ("trainer",), ("trainer",), False, "data.root",
                              "written by the run's process on its host; `agentrl data` reads it there"))
    else:
        out.append(SharedPath("S3 spool and temp files", at(cfg.data.root), ("trainer",), ("trainer",), False, "data.root",
                              "the run's host only"))
    model = cfg.model.path
    if model.startswith("builtin:") or "/" not in model:
        out.append(SharedPath("model", f"{cfg.model.cache_dir.rstrip('/')}/models", (), ("trainer", "inference"),
                              nodes > 1 or elsewhere, "model.cache_dir",
                              f"{model} is built (or imported) here; trainer and servers must load the same weights"))
    else:
        out.append(SharedPath("model", model, (), ("trainer", "inference"), nodes > 1 or elsewhere, "model.path",
                              "trainer and servers load it by this path"))
    keys = (f"{SECRETS_DIR}/<secret>/<key>" if layout == KUBERNETES else "the files AGENTRL_<SECTION>__API_KEY_FILE names")
    out.append(SharedPath("key files", keys, (), tuple(ROLES), False, "<section>.api_key",
                          "each pod (host) its own read-only copy, never a shared path"))
    if layout == HOSTS:
        out.append(SharedPath("job logs and spool", cfg.controlplane.jobs_dir, ("controlplane",), ("controlplane",),
                              cfg.controlplane.executor == "slurm", "controlplane.jobs_dir",
                              "on Slurm the submitted jobs write their logs here from the compute nodes"))
    if cfg.controlplane.state_store.startswith("sqlite"):
        out.append(SharedPath("state store (SQLite)", at(cfg.controlplane.state_store.removeprefix("sqlite:///")), ("controlplane",),
                              ("controlplane",), False, "controlplane.state_store",
                              "one instance's own file; several instances need postgresql://"))
    return out


def warnings(cfg: PlatformConfig, layout: str | None = None) -> list[str]:
    """What in this plan cannot work as configured, each with the fix."""
    layout = layout or layout_of(cfg)
    out = []
    if cfg.training.weight_sync == "distributed" and _servers_elsewhere(cfg, layout):
        out.append("training.weight_sync: distributed opens its group on 127.0.0.1 (weightsync/distributed.py), so inference "
                   "servers on other hosts or pods cannot join it; use training.weight_sync: disk with a shared runs directory")
    if cfg.training.weight_sync not in ("disk", "distributed"):
        out.append(f"training.weight_sync {cfg.training.weight_sync!r} is a plugin: its ports and paths are its own and not listed")
    if layout == KUBERNETES:
        claim, runs = cfg.cluster.runs_volume_claim, in_pod(cfg.observe.runs_dir)
        need = [p for p in shared_paths(cfg, layout) if p.shared]
        on_runs = [p for p in need if _under(in_pod(p.path), runs)]
        if on_runs and not claim:
            out.append(f"cluster.runs_volume_claim is '', so each rendered pod keeps {runs} on an emptyDir of its own and "
                       f"does not share {', '.join(p.what for p in on_runs)}; set cluster.runs_volume_claim (a ReadWriteMany "
                       "PersistentVolumeClaim `agentrl controlplane render` creates and mounts there)")
        if elsewhere := [p for p in need if p not in on_runs]:
            out.append(f"each rendered pod keeps {', '.join(f'{p.what} ({p.path})' for p in elsewhere)} on an emptyDir of its "
                       f"own{f' (PersistentVolumeClaim {claim} holds {runs} only)' if claim else ''}: move them under "
                       f"observe.runs_dir (e.g. model.cache_dir: {cfg.observe.runs_dir.rstrip('/')}/cache) or onto storage "
                       "every trainer and inference pod mounts at that path")
    return out


def in_pod(path: str) -> str:
    """Where a path of the config lands in a rendered pod: they work in WORKDIR, with HOME as ~."""
    if path == "~" or path.startswith("~/"):
        path = HOME + path[1:]
    return posixpath.normpath(posixpath.join(WORKDIR, path))


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def network_dict(cfg: PlatformConfig, layout: str | None = None) -> dict:
    layout = layout or layout_of(cfg)
    return {"layout": layout, "ephemeral_range": list(EPHEMERAL), "ephemeral": EPHEMERAL_NAME,
            "openings": [o.to_dict() for o in openings(cfg, layout)],
            "paths": [p.to_dict() for p in shared_paths(cfg, layout)], "warnings": warnings(cfg, layout)}
