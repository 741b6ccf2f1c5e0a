"""Starting the roles' services on their nodes, each the platform's own command or the real program
(`agentrl serve inference|sandbox|reward|gateway`, the SGLang router, HAProxy, moto's S3 server,
PostgreSQL), bound to its node's address, its output in `<rehearsal>/logs/<name>.log`, started with
`Node.popen` so the network's teardown (or a later reclaim) stops it.

Belongs here: each service's command line, environment and files. Does not: where they run
(`topology.py`), waiting for them (`acceptance/rehearsal/`, through its probe from a node).
"""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from agentrl_cli.ops.rehearse.host import NodesUnavailable
from agentrl_cli.ops.rehearse.nodes import Node
from agentrl_cli.ops.rehearse.topology import REPLICAS, SERVERS, Ports

KEYS = ("sandbox", "reward", "gateway")  # the services that take a key (AGENTRL_<SECTION>__API_KEY_FILE)
AGENTRL = [sys.executable, "-m", "agentrl_cli"]


@dataclass
class Started:
    """A service's process on its node, for the report and for a fault."""

    name: str
    node: str
    proc: subprocess.Popen
    log: Path
    url: str = ""
    argv: list[str] = field(default_factory=list)


def missing_programs() -> list[str]:
    """The programs a rehearsal starts that this host lacks, each with how to install it."""
    out = []
    if shutil.which("haproxy") is None:
        out.append("haproxy (apt-get install -y haproxy)")
    if postgres_binaries() is None:
        out.append("PostgreSQL's initdb and postgres (apt-get install -y postgresql)")
    for module, package in (("sglang_router", "sglang-router"), ("moto.server", "moto[server]")):
        try:
            __import__(module)
        except ImportError:
            out.append(f"the Python package {package} (pip install '{package}')")
    return out


def postgres_binaries() -> tuple[str, str] | None:
    """(initdb, postgres) of this host's PostgreSQL."""
    for d in (os.path.dirname(os.path.realpath(shutil.which("initdb") or "/nonexistent")),
              *sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)):
        if os.path.exists(os.path.join(d, "initdb")) and os.path.exists(os.path.join(d, "postgres")):
            return os.path.join(d, "initdb"), os.path.join(d, "postgres")
    return None


def write_keys(directory: Path) -> dict[str, str]:
    """A fresh key file per keyed service; the environment every agentrl process gets to read them."""
    directory.mkdir(parents=True, exist_ok=True)
    env = {}
    for section in KEYS:
        path = directory / f"{section}.key"
        path.touch(mode=0o600)
        path.write_text(secrets.token_urlsafe(32) + "\n", encoding="utf-8")
        env[f"AGENTRL_{section.upper()}__API_KEY_FILE"] = str(path)
    return env


def base_env(keys_env: dict[str, str]) -> dict[str, str]:
    """The environment of every process of the rehearsal: this one's, no AGENTRL_ settings of the
    caller's (the rehearsal's config decides), the key files, moto's stand-in AWS credentials."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTRL_", "AWS_"))}
    env.update(keys_env)
    env.update(AWS_ACCESS_KEY_ID="rehearsal", AWS_SECRET_ACCESS_KEY=secrets.token_hex(16),  # moto takes any
               AWS_DEFAULT_REGION="us-east-1", AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull,
               PYTHONUNBUFFERED="1")
    return env


def _start(name: str, node: Node, argv: list[str], logs: Path, env: dict, url: str = "", cwd: Path | None = None) -> Started:
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{name}.log"
    with log.open("ab") as out:
        proc = node.popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                          start_new_session=True)
    return Started(name, node.name, proc, log, url, argv)


def inference_server(node: Node, config: Path, ports: Ports, logs: Path, env: dict) -> Started:
    argv = [*AGENTRL, "serve", "inference", "--config", str(config), "--host", node.address, "--port", str(ports.inference)]
    return _start(node.name, node, argv, logs, env, f"http://{node.name}:{ports.inference}")


def router(node: Node, ports: Ports, logs: Path, env: dict, request_timeout_s: float) -> Started:
    """The SGLang router over both servers, round robin; a worker that fails two health checks 2 s
    apart is taken out until it answers again (the router's defaults wait far longer)."""
    argv = [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls",
            *[f"http://{n}:{ports.inference}" for n in SERVERS], "--policy", "round_robin",
            "--host", node.address, "--port", str(ports.router), "--health-check-interval-secs", "2",
            "--health-failure-threshold", "2", "--health-check-timeout-secs", "2",
            "--request-timeout-secs", str(int(request_timeout_s))]
    return _start(node.name, node, argv, logs, env, f"http://{node.name}:{ports.router}")


def sandbox_replica(node: Node, config: Path, ports: Ports, logs: Path, env: dict) -> Started:
    argv = [*AGENTRL, "serve", "sandbox", "--config", str(config), "--host", node.address, "--port", str(ports.sandbox),
            "--set", f"sandbox.replica={node.name}"]
    return _start(node.name, node, argv, logs, env, f"http://{node.name}:{ports.sandbox}")


def haproxy_config(bind: str, servers: dict[str, str], maxconn: int = 4096) -> str:
    """HAProxy balancing every request round robin over `servers` (name -> host:port), each health-checked
    on GET /health every second, as a plain Service in front of the sandbox replicas would."""
    lines = "\n".join(f"  server {name} {where} check inter 1s" for name, where in servers.items())
    return f"""global
  maxconn {maxconn}
defaults
  mode http
  timeout connect 5s
  timeout client 300s
  timeout server 300s
  retries 2
  option redispatch 1
frontend sandboxes
  bind {bind}
  default_backend replicas
backend replicas
  balance roundrobin
  option httpchk GET /health
{lines}
"""


def load_balancer(node: Node, ports: Ports, files: Path, logs: Path, env: dict) -> Started:
    """HAProxy on `node` in front of the sandbox replicas."""
    cfg = files / "haproxy.cfg"
    cfg.write_text(haproxy_config(f"{node.address}:{ports.sandbox}", {n: f"{n}:{ports.sandbox}" for n in REPLICAS}),
                   encoding="utf-8")
    return _start(node.name, node, ["haproxy", "-f", str(cfg), "-db"], logs, env, f"http://{node.name}:{ports.sandbox}")


def reward_service(node: Node, config: Path, ports: Ports, logs: Path, env: dict) -> Started:
    argv = [*AGENTRL, "serve", "reward", "--config", str(config), "--host", node.address, "--port", str(ports.reward)]
    return _start(node.name, node, argv, logs, env, f"http://{node.name}:{ports.reward}")


def gateway(node: Node, config: Path, ports: Ports, logs: Path, env: dict) -> Started:
    argv = [*AGENTRL, "serve", "gateway", "--config", str(config), "--host", node.address, "--port", str(ports.gateway),
            "--inference-url", f"http://router-0:{ports.router}"]
    return _start(node.name, node, argv, logs, env, f"http://{node.name}:{ports.gateway}")


def s3(node: Node, ports: Ports, logs: Path, env: dict) -> Started:
    argv = [sys.executable, "-m", "moto.server", "-H", node.address, "-p", str(ports.s3)]
    return _start(node.name, node, argv, logs, env, f"http://{node.name}:{ports.s3}")


def postgres(node: Node, ports: Ports, files: Path, logs: Path, env: dict, subnet: str) -> Started:
    """A fresh PostgreSQL cluster in the network's files (removed with them), run as the `postgres`
    user, listening on the node's address, trusting the simulated subnet only."""
    found = postgres_binaries()
    if found is None:
        raise NodesUnavailable("PostgreSQL is not installed (initdb/postgres not found)", "apt-get install -y postgresql")
    initdb, server = found
    root = files / "postgres"
    data, sock = root / "data", root / "sock"
    sock.mkdir(parents=True, exist_ok=True)
    for p in (root, sock):
        shutil.chown(p, "postgres", "postgres")
    for p in (files, *files.parents):  # the postgres user must reach its directory
        if p != Path("/"):
            os.chmod(p, os.stat(p).st_mode | 0o011)
    as_user = ["runuser", "-u", "postgres", "--"]
    done = subprocess.run([*as_user, initdb, "-D", str(data), "-U", "agentrl", "--auth=trust", "-E", "UTF8", "--no-sync"],
                          capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise NodesUnavailable(f"initdb failed: {done.stderr.strip()[-500:]}", "see the message; PostgreSQL runs as the postgres user")
    with (data / "pg_hba.conf").open("a") as f:
        f.write(f"host all all {subnet} trust\n")
    argv = [*as_user, server, "-D", str(data), "-c", f"listen_addresses={node.address}", "-p", str(ports.postgresql),
            "-k", str(sock), "-c", "fsync=off", "-c", "max_connections=50"]
    return _start(node.name, node, argv, logs, env, f"postgresql://agentrl@{node.name}:{ports.postgresql}/postgres")
