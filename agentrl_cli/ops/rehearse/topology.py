"""The deployment a rehearsal brings up: which node runs which role, the ports they serve on, the
paths every node shares, and the config the roles run with (the user's config with the nodes'
addresses filled in, as `agentrl controlplane render` fills in the cluster's).

The nodes, one role each unless said otherwise:
- trainer-0, trainer-1: one trainer rank each (`cluster.nodes: 2`, `training.world_size: 2`, the
  `deepspeed` launcher over the hostfile); trainer-0 also runs the run's process and submits it
  as a job (role controlplane, its state in PostgreSQL).
- inference-0, inference-1: an inference server each (`inference.urls`), router-0 the SGLang router
  in front of them (`inference.router_url`; role inference).
- sandbox-0, sandbox-1: the sandbox service's replicas (`sandbox.replica_url`), sandbox-lb HAProxy
  in front of them (`sandbox.service_url`; role sandbox).
- reward-0 (`reward.service_url`), gateway-0 (`agentrl serve gateway`), s3-0 (moto's S3 server,
  `data.s3.endpoint_url`), postgres-0 (`controlplane.state_store`).

Belongs here: names, placement, ports, shared paths and the rehearsal's config. Does not: starting
anything (`services.py`), the rehearsal itself (`acceptance/rehearsal/`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from agentrl_cli.config.models import PlatformConfig
from agentrl_cli.ops.controlplane.k8s_names import PORTS

NODES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("trainer-0", ("trainer", "controlplane")), ("trainer-1", ("trainer",)),
    ("inference-0", ("inference",)), ("inference-1", ("inference",)), ("router-0", ("inference",)),
    ("sandbox-0", ("sandbox",)), ("sandbox-1", ("sandbox",)), ("sandbox-lb", ("sandbox",)),
    ("reward-0", ("reward",)), ("gateway-0", ("gateway",)), ("s3-0", ("s3",)), ("postgres-0", ("postgresql",)),
)
TRAINERS = ("trainer-0", "trainer-1")
SERVERS = ("inference-0", "inference-1")
REPLICAS = ("sandbox-0", "sandbox-1")
ROUTER_PORT_OFFSET = 10  # the router listens on inference.port + 10 on its node
S3_PORT, PG_PORT = 9000, 5432
BUCKET = "agentrl-rehearsal"
SHARED_ROOT = "/srv/agentrl"  # where every node sees the shared paths
RUNS, CACHE = f"{SHARED_ROOT}/runs", f"{SHARED_ROOT}/cache"


@dataclass(frozen=True)
class Ports:
    inference: int
    router: int
    sandbox: int = PORTS["sandbox"]
    reward: int = PORTS["reward"]
    gateway: int = PORTS["gateway"]
    s3: int = S3_PORT
    postgresql: int = PG_PORT

    @classmethod
    def of(cls, cfg: PlatformConfig) -> Ports:
        return cls(inference=cfg.inference.port, router=cfg.inference.port + ROUTER_PORT_OFFSET)


def placement(addresses: dict[str, str]) -> dict[str, list[str]]:
    """role -> the addresses of the nodes it runs on (`addresses`: node name -> address)."""
    out: dict[str, list[str]] = {}
    for name, roles in NODES:
        for role in roles:
            out.setdefault(role, []).append(addresses[name])
    return out


CHAOS_SMOKE_STEPS = 150  # long enough for three faults and their recoveries while it trains


def rehearsal_config(cfg: PlatformConfig, ports: Ports, *, chaos: bool = False) -> PlatformConfig:
    """`cfg` as the nodes run it: two trainer nodes, the services at their nodes' names, the trajectory
    store on S3, the control plane's state in PostgreSQL, the runs directory and the model cache at
    the shared paths; with `chaos`, a smoke phase long enough for the faults. Secrets stay out (each
    process reads its key file)."""
    from agentrl_cli.config.load import secret_keys

    data = cfg.model_dump(mode="json")
    for section, key in secret_keys():
        data[section][key] = None
    world = max(2, cfg.training.world_size - cfg.training.world_size % 2)
    data["training"].update(world_size=world)
    data["cluster"].update(nodes=2)
    data["inference"].update(urls=[f"http://{n}:{ports.inference}" for n in SERVERS], router_url=f"http://router-0:{ports.router}",
                             engine="hf")
    data["sandbox"].update(service_url=f"http://sandbox-lb:{ports.sandbox}", replica_url=f"http://{{replica}}:{ports.sandbox}")
    data["reward"].update(service_url=f"http://reward-0:{ports.reward}")
    data["data"].update(store="s3", s3={**data["data"]["s3"], "endpoint_url": f"http://s3-0:{ports.s3}", "bucket": BUCKET})
    data["controlplane"].update(state_store=f"postgresql://agentrl@postgres-0:{ports.postgresql}/postgres",
                                executor="local", jobs_dir=f"{RUNS}/jobs")
    data["observe"].update(runs_dir=RUNS)
    data["model"].update(cache_dir=CACHE)
    if chaos:
        data["stages"].update(smoke_steps=max(CHAOS_SMOKE_STEPS, cfg.stages.smoke_steps))
    return PlatformConfig.model_validate(data)


def shared_paths(cfg: PlatformConfig, rehearsal_dir: Path) -> dict[str, str]:
    """Every node's shared paths -> the host directories behind them: the runs volume (weight exports,
    checkpoints, the trainer ranks' control files, job logs) and the model cache."""
    runs = rehearsal_dir / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    cache = Path(cfg.model.cache_dir).expanduser()
    cache.mkdir(parents=True, exist_ok=True)
    return {RUNS: str(runs), CACHE: str(cache)}
