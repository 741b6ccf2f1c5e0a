"""Start and stop inference servers from the config: SGLang (`python -m sglang.launch_server`,
possibly with another interpreter, since SGLang usually lives in its own environment or image),
the SGLang router in front of several replicas, or the embedded server (`agentrl serve inference
--engine hf`). Each server's log streams to the run directory; start-up waits for health with a
deadline; stop is terminate, then kill. A server keeps the command and environment it was started with,
so the run's supervisor (`agentrl_cli/run/supervise/`) can start it again on the same port (`relaunch`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import httpx

from agentrl_cli.core.errors import AgentrlError, ConfigError
from agentrl_cli.core.httpclient import http_client
from agentrl_cli.core.logstreams import level_env

ROUTER_POLICY = {"least_loaded": "power_of_two"}  # the router has no least_loaded; power-of-two is its nearest


class InferenceUnavailable(AgentrlError):
    """The configured engine cannot be started here."""


@dataclass
class ServerProcess:
    name: str
    url: str
    proc: subprocess.Popen
    log_path: Path
    cmd: list[str] = field(default_factory=list)  # what started it, for `relaunch`
    env: dict | None = field(default=None, repr=False)  # may hold its key (key_env): never logged
    before_start: Callable[[], None] | None = field(default=None, repr=False)  # writes what the command reads at start-up
    after_healthy: Callable[[], None] | None = field(default=None, repr=False)  # removes it again

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


TOOL_CALL_PARSER = "qwen25"  # SGLang's parser of Hermes `<tool_call>` blocks: the convention agentrl's chat renderer and embedded server use


def sglang_command(cfg, model_path: str, port: int, lora=None, key_dir: Path | None = None) -> list[str]:
    """SGLang's command line for `cfg` (the inference section). With `lora` (training.lora) the server
    takes LoRA adapters loaded at run time (`--enable-lora`), sized for them: `--max-lora-rank` and
    `--lora-target-modules` are fixed at launch, and an adapter of a higher rank or other modules is refused.
    The key (inference.api_key) never goes on the command line, which every user of the host can read:
    it goes into a YAML file only this user can read, in `key_dir`, that SGLang reads with `--config`."""
    if lora is not None and cfg.dp_size > 1:
        raise ConfigError(f"SGLang loads LoRA adapters at run time only with one data-parallel rank (its "
                          f"load_lora_adapter asserts dp_size == 1); inference.dp_size is {cfg.dp_size}",
                          "set inference.dp_size: 1 and start more servers with inference.replicas, or unset training.lora")
    cmd = [cfg.python, "-m", "sglang.launch_server", "--model-path", str(model_path), "--host", cfg.host,
           "--port", str(port), "--tp-size", str(cfg.tp_size), "--dp-size", str(cfg.dp_size), "--weight-version", "0",
           "--tool-call-parser", TOOL_CALL_PARSER]
    if cfg.mem_fraction_static is not None:
        cmd += ["--mem-fraction-static", str(cfg.mem_fraction_static)]
    if cfg.max_running_requests is not None:
        cmd += ["--max-running-requests", str(cfg.max_running_requests)]
    if cfg.api_key is not None:
        cmd += ["--config", str(sglang_key_file(cfg.api_key.get_secret_value(), key_dir, port))]
    if cfg.enable_metrics:
        cmd.append("--enable-metrics")
    if cfg.prefix_cache_tokens == 0:
        cmd.append("--disable-radix-cache")
    if lora is not None:
        cmd += ["--enable-lora", "--max-lora-rank", str(lora.rank), "--lora-target-modules", *lora.target_modules]
    return cmd


def sglang_key_file(key: str, key_dir: Path | None, port: int) -> Path:
    """`api-key: KEY` in `key_dir/sglang-PORT.yaml` (mode 0600; a private temporary directory when
    `key_dir` is None), the form SGLang's `--config` reads."""
    import tempfile

    import yaml

    directory = Path(key_dir) if key_dir is not None else Path(tempfile.mkdtemp(prefix="agentrl-sglang-"))
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = directory / f"sglang-{port}.yaml"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(yaml.safe_dump({"api-key": key}))
    os.chmod(path, 0o600)
    return path


def _key_file_hooks(cfg, key_dir: Path, port: int) -> tuple[Callable[[], None], Callable[[], None]]:
    """(write SGLang's key file for `port` again, remove it): around a restart of that server."""
    key = cfg.api_key.get_secret_value()

    def write() -> None:
        sglang_key_file(key, key_dir, port)

    def remove() -> None:
        (Path(key_dir) / f"sglang-{port}.yaml").unlink(missing_ok=True)
    return write, remove


def router_command(cfg, worker_urls: list[str], port: int) -> list[str]:
    return [cfg.python, "-m", "sglang_router.launch_router", "--worker-urls", *worker_urls,
            "--policy", ROUTER_POLICY.get(cfg.router_policy, cfg.router_policy), "--host", cfg.host, "--port", str(port)]


def hf_command(cfg, model_path: str, port: int, batch_window_ms: float, dtype: str, context_length: int) -> list[str]:
    cmd = [sys.executable, "-m", "agentrl_cli", "serve", "inference", "--engine", "hf", "--model", str(model_path),
           "--host", cfg.host, "--port", str(port), "--batch-window-ms", str(batch_window_ms),
           "--max-batch-size", str(cfg.max_batch_size), "--dtype", dtype, "--context-length", str(context_length),
           "--weight-version", "0", "--prefix-cache-tokens", str(cfg.prefix_cache_tokens)]
    return cmd  # no key: argv is readable by every user of the host; `key_env` hands it over


def key_env(cfg) -> dict[str, str]:
    """The environment that gives an embedded server its key (inference.api_key): none when the key
    comes from AGENTRL_INFERENCE__API_KEY_FILE, which the child inherits and follows through rotations."""
    if cfg.api_key is None or os.environ.get("AGENTRL_INFERENCE__API_KEY_FILE"):
        return {}
    return {"AGENTRL_INFERENCE__API_KEY": json.dumps(cfg.api_key.get_secret_value())}  # a YAML string, as the loader parses it


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
    inf = config.inference
    servers = inf.replicas if inf.engine == "hf" and not inf.urls else 0
    ranks = max(1, config.training.world_size // max(1, config.cluster.nodes)) if trainer_here else 0
    share = max(1, host_cores() // max(1, servers + ranks))
    return config.training.cpu_threads or share, inf.cpu_threads or share


def thread_env(threads: int) -> dict[str, str]:
    """The environment that caps a child process's torch (OpenMP / MKL) threads."""
    return {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


def check_sglang(python: str) -> None:
    try:
        proc = subprocess.run([python, "-c", "import sglang, sys; print(sglang.__version__)"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as exc:
        proc = None
        problem = str(exc)
    else:
        problem = proc.stderr.strip().splitlines()[-1] if proc.returncode else ""
    if proc is None or proc.returncode != 0:
        raise InferenceUnavailable(f"SGLang is not installed for {python} ({problem or 'import failed'})",
                                   "on a GPU host: pip install 'agentrl-cli[sglang]' (or `pip install sglang[all] sglang-router`), "
                                   "or set inference.python to the interpreter of the environment that has SGLang; "
                                   "on a CPU box use inference.engine: hf")


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the launching thread dies (Linux), so a server a run
    started never outlives the run, even when the run is SIGKILLed."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def start_process(name: str, cmd: list[str], url: str, logs: Path, env: dict | None = None) -> ServerProcess:
    """Start `cmd` in its own session (`env` added to this environment), its output appended to
    `logs/<name>.log`; it gets SIGTERM when the thread that started it ends."""
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{name}.log"
    log = open(log_path, "ab")
    try:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **(env or {})}, preexec_fn=_die_with_parent)
    finally:
        log.close()
    return ServerProcess(name, url, proc, log_path, list(cmd), env)


def relaunch(server: ServerProcess) -> None:
    """Start `server`'s command again on its port, in place (`server.proc` is the new process); the
    old process, if still running, is stopped first. Call it from the thread that owns the run (the
    child gets SIGTERM when the starting thread dies), then wait for health (`wait_healthy`)."""
    server.stop(timeout_s=5.0)
    if server.before_start is not None:
        server.before_start()
    again = start_process(server.name, server.cmd, server.url, server.log_path.parent, server.env)
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


def wait_reachable(urls: list[str], deadline_s: float) -> None:
    """Servers started elsewhere (`inference.urls`): each answers /health within the deadline."""
    pending = _poll_ready(urls, lambda u: u, "/health", deadline_s)
    if pending:
        raise InferenceUnavailable(f"inference.urls not healthy within {deadline_s:.0f} s: {', '.join(pending)}",
                                   "start those servers (`agentrl serve inference`) or correct inference.urls")


def launch(config, model_path: str, logs: Path, beside_trainer: bool = False) -> tuple[list[ServerProcess], list[str]]:
    """Start what the config asks for; returns (processes, the URLs clients should use: the router's
    when there is one, else every server's, for the client to spread requests over).
    `beside_trainer`: a trainer runs on this host too, so embedded servers take their share of the
    cores only (`cpu_thread_split`)."""
    cfg = config.inference
    if cfg.urls:  # servers this run did not start: wait for them, start nothing
        urls = [u.rstrip("/") for u in cfg.urls]
        wait_reachable(urls, cfg.startup_timeout_s)
        return [], urls
    servers: list[ServerProcess] = []
    try:
        if cfg.engine == "sglang":
            check_sglang(cfg.python)
        for i in range(cfg.replicas):
            port = cfg.port + i
            url = f"http://{cfg.host}:{port}"
            cmd = (sglang_command(cfg, model_path, port, config.training.lora, logs.parent / "keys")
                   + ["--log-level", config.observe.log_level] if cfg.engine == "sglang" else
                   hf_command(cfg, model_path, port, config.rollout.batch_window_ms,
                              config.model.dtype, config.model.context_length))
            env = ({**thread_env(cpu_thread_split(config, beside_trainer)[1]), **key_env(cfg), **level_env(config.observe.log_level)}
                   if cfg.engine == "hf" else None)  # the run's log level: the child's config loader reads it
            servers.append(start_process(f"{cfg.engine}-{i}", cmd, url, logs, env))
            if cfg.engine == "sglang" and cfg.api_key is not None:  # a restart needs the key file again, briefly
                servers[-1].before_start, servers[-1].after_healthy = _key_file_hooks(cfg, logs.parent / "keys", port)
        wait_healthy(servers, cfg.startup_timeout_s)
        for key_file in (logs.parent / "keys").glob("sglang-*.yaml"):  # read at start-up; no copy stays on disk
            key_file.unlink(missing_ok=True)
        if cfg.replicas > 1 and cfg.engine == "sglang":
            router_port = cfg.port + cfg.replicas
            router = start_process("router", router_command(cfg, [s.url for s in servers], router_port),
                            f"http://{cfg.host}:{router_port}", logs)
            servers.append(router)
            wait_healthy([router], cfg.startup_timeout_s, path="/health")
            return servers, [router.url]
        return servers, [s.url for s in servers]
    except BaseException:
        for s in servers:
            s.stop()
        raise
