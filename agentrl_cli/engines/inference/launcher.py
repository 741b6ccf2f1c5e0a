"""Start and stop inference servers from the config, whatever the engine (`inference.engine`,
asked through its `InferenceEngine` object: `agentrl_cli/engines/engine.py`): each server's command
and environment come from the engine, and a router in front of the replicas when the engine wants
one. Each server's log streams to the run directory; start-up waits for the engine's ready route
with a deadline; stop is terminate, then kill. A server keeps the command and environment it was
started with, so the run's supervisor (`agentrl_cli/run/supervise/`) can start it again on the
same port (`relaunch`)."""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import httpx

from agentrl_cli.core.errors import AgentrlError
from agentrl_cli.core.httpclient import http_client
from agentrl_cli.engines.engine import ROUTER


class InferenceUnavailable(AgentrlError):
    """The configured engine cannot be started here."""


@dataclass
class ServerProcess:
    name: str
    url: str
    proc: subprocess.Popen
    log_path: Path
    cmd: list[str] = field(default_factory=list)  # what started it, for `relaunch`
    env: dict | None = field(default=None, repr=False)  # may hold its key (embedded.key_env): never logged
    before_start: Callable[[], None] | None = field(default=None, repr=False)  # writes what the command reads at start-up
    after_healthy: Callable[[], None] | None = field(default=None, repr=False)  # removes it again
    base_env: dict | None = field(default=None, repr=False)  # the environment it started from (None: the process's then)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_bytes()[-n:].decode("utf-8", "replace")
        except OSError:
            return ""

    def stop(self, timeout_s: float = 15.0) -> None:
        if self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except OSError:
            pass
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


def host_cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cpu_thread_split(config, trainer_here: bool = True) -> tuple[int, int]:
    """(torch threads per trainer rank, per embedded server) on this host: `training.cpu_threads` and
    `inference.cpu_threads`, each 0 = auto: the host's cores split evenly between the embedded servers
    a run starts here and its trainer ranks on this node (`trainer_here`; servers started without a
    trainer beside them, as stage 4 and `agentrl serve` do, share the cores among themselves). On two cores shared by a trainer and a
    server, one thread each beat two each by 1.5-3x in `benchmarks/peer_trl.py`: two processes with
    two OpenMP threads apiece on two cores spin against each other at every parallel region."""
    from agentrl_cli.engines.registry import engine_for

    inf = config.inference
    servers = inf.replicas if engine_for(config).capabilities.host_cpu and not inf.urls else 0
    ranks = max(1, config.training.world_size // max(1, config.cluster.nodes)) if trainer_here else 0
    share = max(1, host_cores() // max(1, servers + ranks))
    return config.training.cpu_threads or share, inf.cpu_threads or share


def thread_env(threads: int) -> dict[str, str]:
    """The environment that caps a child process's torch (OpenMP / MKL) threads."""
    return {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the launching thread dies (Linux), so a server a run
    started never outlives the run, even when the run is SIGKILLed. Only where `setpriv` is missing
    (`_pdeathsig_wrapper`): a Python `preexec_fn` makes the fork take the interpreter's import lock,
    which deadlocks against another thread importing a module that logs (`pdeathsig_safe_beside_threads`)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


@functools.cache
def _pdeathsig_wrapper() -> tuple[str, ...] | None:
    """util-linux's `setpriv --pdeathsig TERM --`, which sets the parent-death signal and execs the
    command: the child starts with no Python code run after the fork (and by vfork), so starting a
    server is safe while other threads of this process import or log. None where it is missing or
    too old (util-linux < 2.33)."""
    path = shutil.which("setpriv")
    if path is None:
        return None
    try:
        ok = subprocess.run([path, "--pdeathsig", "TERM", "--", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    return (os.path.realpath(path), "--pdeathsig", "TERM", "--") if ok else None


def _await_exec(proc: subprocess.Popen, wrapper: str, deadline_s: float = 10.0) -> None:
    """Wait until `wrapper` (setpriv) has exec'd the command, so its parent-death signal is set when
    `start_process` returns: a starting thread that ended sooner would leave the server running."""
    end = time.monotonic() + deadline_s
    while proc.poll() is None and time.monotonic() < end:
        try:
            if os.readlink(f"/proc/{proc.pid}/exe") != wrapper:
                return
        except OSError:
            return
        time.sleep(0.001)


def pdeathsig_safe_beside_threads() -> bool:
    """Whether servers can start while other threads of this process work (`PartsBuilder` builds the
    trainer meanwhile): true with `setpriv`; without it the `preexec_fn` fallback forks under the import
    lock, and a thread importing a module that logs meanwhile deadlocks both (CPython 3.11)."""
    return _pdeathsig_wrapper() is not None


def start_process(name: str, cmd: list[str], url: str, logs: Path, env: dict | None = None,
                  base_env: dict | None = None) -> ServerProcess:
    """Start `cmd` in its own session (`env` added to `base_env`, default this process's environment),
    its output appended to `logs/<name>.log`; it gets SIGTERM when the thread that started it ends."""
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{name}.log"
    log = open(log_path, "ab")
    wrapper = _pdeathsig_wrapper()
    try:
        proc = subprocess.Popen([*(wrapper or ()), *cmd], stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**(os.environ if base_env is None else base_env), **(env or {})},
                                preexec_fn=None if wrapper else _die_with_parent)
    finally:
        log.close()
    if wrapper:
        _await_exec(proc, wrapper[0])
    return ServerProcess(name, url, proc, log_path, list(cmd), env, base_env=base_env)


def relaunch(server: ServerProcess) -> None:
    """Start `server`'s command again on its port, in place (`server.proc` is the new process); the
    old process, if still running, is stopped first. Call it from the thread that owns the run (the
    child gets SIGTERM when the starting thread dies), then wait for health (`wait_healthy`)."""
    server.stop(timeout_s=5.0)
    if server.before_start is not None:
        server.before_start()
    again = start_process(server.name, server.cmd, server.url, server.log_path.parent, server.env, server.base_env)
    server.proc = again.proc


def _poll_ready(items: list, url_of, path: str, deadline_s: float, before=lambda item: None) -> list:
    """Poll `url_of(item) + path` until each answers 200 or the deadline passes; returns those that
    never did. `before(item)` runs ahead of each probe (it may raise to stop waiting)."""
    end = time.monotonic() + deadline_s
    pending = list(items)
    with http_client(timeout=5) as client:
        while pending and time.monotonic() < end:
            for item in list(pending):
                before(item)
                try:
                    if client.get(url_of(item) + path).status_code == 200:
                        pending.remove(item)
                except httpx.TransportError:
                    pass
            if pending:
                time.sleep(0.2)
    return pending


def wait_healthy(servers: list[ServerProcess], deadline_s: float, path: str = "/health_generate") -> None:
    def still_alive(s: ServerProcess) -> None:
        if not s.alive():
            raise InferenceUnavailable(f"{s.name} exited during start-up (code {s.proc.returncode}):\n{s.log_tail(1500)}",
                                       f"see {s.log_path}")

    pending = _poll_ready(servers, lambda s: s.url, path, deadline_s, still_alive)
    if pending:
        raise InferenceUnavailable(f"not healthy within {deadline_s:.0f} s: {', '.join(s.name for s in pending)}",
                                   f"see {pending[0].log_path}; raise inference.startup_timeout_s for large models")


def wait_reachable(urls: list[str], deadline_s: float, path: str = "/health") -> None:
    """Servers started elsewhere (`inference.urls`): each answers `path` (its engine's health route)
    within the deadline."""
    pending = _poll_ready(urls, lambda u: u, path, deadline_s)
    if pending:
        raise InferenceUnavailable(f"inference.urls not healthy within {deadline_s:.0f} s: {', '.join(pending)}",
                                   "start those servers (`agentrl serve inference`) or correct inference.urls")


def router_url(config, servers: list[ServerProcess]) -> str | None:
    """Where generation requests go instead of spreading them over the servers: the router this run
    started (`launch`), else `inference.router_url`; None without a router."""
    started = next((s.url for s in servers if s.name == ROUTER), None)
    return started or config.inference.router_url.rstrip("/") or None


def launch(config, model_path: str, logs: Path, beside_trainer: bool = False,
           environ: dict | None = None) -> tuple[list[ServerProcess], list[str]]:
    """Start what the config asks for; returns (processes, the servers' URLs). When the engine puts a
    router in front of several servers it is the last process (named `router`; `router_url`), and the
    client sends generation there while weight updates go to every server's URL.
    `beside_trainer`: a trainer runs on this host too, so embedded servers take their share of the
    cores only (`cpu_thread_split`). `environ`: the environment the processes start from (default this
    process's), for a caller whose other threads change `os.environ` meanwhile."""
    from agentrl_cli.engines.registry import engine_for

    cfg, engine = config.inference, engine_for(config)
    if cfg.urls:  # servers this run did not start (and the router in front of them): wait for them, start nothing
        urls = [u.rstrip("/") for u in cfg.urls]
        wait_reachable(urls + ([cfg.router_url.rstrip("/")] if cfg.router_url else []), cfg.startup_timeout_s,
                       engine.routes.health)
        return [], urls
    servers: list[ServerProcess] = []
    try:
        engine.check_installed(cfg)
        for i in range(cfg.replicas):
            port = cfg.port + i
            spec = engine.server_launch(config, model_path, port, key_dir=logs.parent / "keys", beside_trainer=beside_trainer)
            servers.append(start_process(f"{engine.name}-{i}", spec.cmd, f"http://{cfg.host}:{port}", logs, spec.env, environ))
            servers[-1].before_start, servers[-1].after_healthy = spec.before_start, spec.after_healthy
        wait_healthy(servers, cfg.startup_timeout_s, path=engine.routes.ready)
        for s in servers:
            if s.after_healthy is not None:  # e.g. a key file read at start-up: no copy stays on disk
                s.after_healthy()
        router = next((p for p in engine.ports(cfg) if p.role == ROUTER), None) if engine.needs_router(cfg.replicas) else None
        if router is not None:
            spec = engine.router_launch(cfg, [s.url for s in servers], router.first)
            servers.append(start_process(ROUTER, spec.cmd, f"http://{cfg.host}:{router.first}", logs, spec.env, environ))
            wait_healthy(servers[-1:], cfg.startup_timeout_s, path=engine.routes.health)
            return servers, [s.url for s in servers[:-1]]
        return servers, [s.url for s in servers]
    except BaseException:
        for s in servers:
            s.stop()
        raise
