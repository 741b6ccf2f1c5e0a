"""`training.world_size` DeepSpeed ranks started through a launcher, driven from the run's process.
Implements `backend.TrainingBackend` (plus `named_tensors` for the distributed weight sync).

What belongs here: the launcher's command line (torchrun on one host; the `deepspeed` launcher with
a hostfile when `cluster.nodes` > 1), waiting for rank 0's command channel, forwarding calls, and
naming a rank that died. Not here: what a rank does (`rank_worker.py`), the step itself
(`deepspeed_backend.py`).

Choices worth knowing:
- The launcher runs in its own session with its output in `<run>/logs/trainer-ranks.log`; the
  control files (the training config, the channel's key, rank 0's port and the ranks' pids) are in
  `<run>/trainer-ranks/`. The ranks see the run directory, so on several hosts it must be shared,
  and the run's process must be on the first host of the hostfile (the channel listens on 127.0.0.1).
- When a rank dies the launcher stops the others and exits; the next call (or the call in flight)
  raises `TrainerRanksFailed` naming the rank and its exit status as the launcher logged them. The
  backend is then unusable; a new one resumes from the last checkpoint (same world size).
- Every wait has a deadline: the start (the launcher's rendezvous, DeepSpeed's set-up, the model
  load) `training.start_timeout_s`, every call (a train step, a checkpoint, an export)
  `training.rank_timeout_s`. Past one the ranks are stopped and `TrainerRanksFailed` names the
  call, the seconds and the key ("did not answer": a hang, which the run restarts from).
- One host: gloo binds to the loopback interface, the rendezvous is on 127.0.0.1, and without GPUs
  each rank gets `training.cpu_threads` OpenMP threads (auto: the cores split between the ranks and
  the embedded servers the run starts on this host).
- Several hosts: the `deepspeed` launcher starts every rank (this host's too) over pdsh and ssh, so
  a rank's environment is the ssh session's plus what the launcher exports: PYTHON* variables and
  the lines of its `.deepspeed_env` file. The variables set here that it would drop (the accelerator,
  OpenMP threads, the collectives' interface, the log level) go in `<control>/deepspeed_env`, named by
  DS_ENV_FILE, followed by the lines of the user's own `.deepspeed_env` (theirs win).
- Where the hosts come from, first found: the `hostfile` argument, DLTS_HOSTFILE, /job/hostfile, and
  last a Slurm allocation: inside one (SLURM_JOB_NODELIST set, e.g. the job `agentrl job submit
  --training` hands `sbatch --nodes=cluster.nodes`) `scontrol show hostnames` expands the node list
  into `<control>/hostfile`, `HOST slots=<world_size / nodes>` per node, this host first (the
  batch script runs on the allocation's first node, and the run's process must be on the first
  host). An allocation with fewer nodes than `cluster.nodes` is refused, naming the fix.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Client
from pathlib import Path

from agentrl_cli.core.errors import AgentrlError, ConfigError
from agentrl_cli.core.logstreams import LEVEL_ENV
from agentrl_cli.learner import rank_worker
from agentrl_cli.learner.process_group import free_port as _free_port, loopback_ifname as _loopback_ifname

STOP_TIMEOUT_S = 60.0
LOG_TAIL_CHARS = 3000
HOSTFILE_ENV = "DLTS_HOSTFILE"  # the `deepspeed` launcher's own variable; default /job/hostfile
DEFAULT_HOSTFILE = "/job/hostfile"
SLURM_NODELIST_ENV = "SLURM_JOB_NODELIST"  # set by Slurm inside an allocation (sbatch, salloc)
ALLOCATION_HOSTFILE = "hostfile"  # in the control directory, written from the Slurm allocation
ENV_FILE_ENV, DEFAULT_ENV_FILE = "DS_ENV_FILE", ".deepspeed_env"  # the launcher's file name, looked for in ~ and its cwd
ENV_FILE = "deepspeed_env"  # in the control directory
# what rank_environment may set that the launcher's pdsh path does not export (it exports PYTHON*, MLFLOW*, MV2*, UCX*)
REMOTE_VARIABLES = ("DS_ACCELERATOR", "OMP_NUM_THREADS", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", LEVEL_ENV)


class TrainerRanksFailed(AgentrlError):
    """A trainer rank died, never joined, or its launcher exited."""

    exit_code = 1

    def __init__(self, message: str, hint: str = "", *, rank: int | None = None, exit_status: int | None = None) -> None:
        super().__init__(message, hint)
        self.rank, self.exit_status = rank, exit_status


_FAILURE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")


def failed_ranks(log_text: str) -> list[tuple[int, int]]:
    """(rank, exit status) of every failed rank the launcher reported, the likely cause first: a
    rank killed by a signal (negative status), then one that exited with an error, and last the
    ranks the launcher itself stopped with SIGTERM once a peer had failed."""
    found = {int(r): int(code) for r, code in _FAILURE.findall(log_text)}
    return sorted(found.items(), key=lambda rc: (rc[1] == -signal.SIGTERM, rc[1] >= 0, rc[0]))


def describe_status(status: int) -> str:
    if status < 0:
        try:
            return f"{status}: killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"{status}: killed by signal {-status}"
    return str(status)


def hostfile_hosts(path: Path) -> list[tuple[str, int]]:
    """(host, slots) of a DeepSpeed hostfile (`host slots=N` lines, # comments)."""
    hosts = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"(\S+)\s+slots\s*=\s*(\d+)", line)
        if not m:
            raise ConfigError(f"hostfile {path}: cannot read line {line!r}", "write one `HOST slots=N` per line")
        hosts.append((m.group(1), int(m.group(2))))
    return hosts


def launcher_command(cfg, model_path: Path, control: Path, *, port: int | None = None,
                     hostfile: Path | None = None) -> list[str]:
    """The launcher's argv: torchrun for one node, the `deepspeed` launcher over a hostfile for more.
    The rendezvous port is `port` when given, else `training.master_port` on several nodes (every node
    must agree on it, and reach it on the first host), else a free loopback port (one node)."""
    world, nodes = cfg.training.world_size, cfg.cluster.nodes
    if world % nodes:
        raise ConfigError(f"training.world_size={world} is not a multiple of cluster.nodes={nodes}",
                          "give every node the same number of ranks: set training.world_size to a multiple of cluster.nodes")
    per_node = world // nodes
    worker = ["--model", str(Path(model_path).absolute()), "--control", str(Path(control).absolute()),
              "--temperature", repr(float(cfg.inference.temperature))]
    port = port or (cfg.training.master_port if nodes > 1 else _free_port())
    if nodes == 1:
        return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(per_node), "--nnodes", "1",
                "--master_addr", "127.0.0.1", "--master_port", str(port), "--max_restarts", "0",
                "-m", rank_worker.__name__, *worker]
    hostfile = Path(hostfile or os.environ.get(HOSTFILE_ENV) or DEFAULT_HOSTFILE)
    given = hostfile != Path(DEFAULT_HOSTFILE) or hostfile.is_file()
    if not given and os.environ.get(SLURM_NODELIST_ENV):
        hostfile = allocation_hostfile(os.environ[SLURM_NODELIST_ENV], Path(control), nodes, per_node)
    if not hostfile.is_file():
        raise ConfigError(f"cluster.nodes={nodes} needs a hostfile, and {hostfile} does not exist",
                          f"write `HOST slots={per_node}` lines for {nodes} hosts to {DEFAULT_HOSTFILE} or set "
                          f"{HOSTFILE_ENV}; run inside a Slurm allocation of {nodes} nodes (agentrl job submit "
                          "--training with controlplane.executor: slurm); or set cluster.nodes: 1")
    hosts = hostfile_hosts(hostfile)
    if len(hosts) < nodes or any(slots < per_node for _, slots in hosts[:nodes]):
        raise ConfigError(f"hostfile {hostfile} lists {hosts}; cluster.nodes={nodes} with training.world_size={world} "
                          f"needs {nodes} hosts with slots >= {per_node}", "fix the hostfile or the two keys")
    return [sys.executable, "-m", "deepspeed.launcher.runner", "--hostfile", str(hostfile), "--num_nodes", str(nodes),
            "--num_gpus", str(per_node), "--master_addr", hosts[0][0], "--master_port", str(port),
            "--module", rank_worker.__name__, *worker]


def allocation_hostfile(nodelist: str, control: Path, nodes: int, per_node: int) -> Path:
    """`<control>/hostfile` for the Slurm allocation `nodelist` (SLURM_JOB_NODELIST, e.g. `trainer-[0-1]`),
    expanded by `scontrol show hostnames`: `HOST slots=per_node` per node, this host first. Refuses an
    allocation of fewer than `nodes` nodes."""
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        raise ConfigError(f"cluster.nodes={nodes} inside a Slurm allocation ({SLURM_NODELIST_ENV}={nodelist}), but "
                          "scontrol is not installed here to expand its node list",
                          f"install the Slurm client (apt-get install slurm-client), or set {HOSTFILE_ENV} to a hostfile")
    try:
        done = subprocess.run([scontrol, "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        done = subprocess.CompletedProcess([], 1, "", "did not answer within 30 s")
    hosts = done.stdout.split()
    if done.returncode != 0 or not hosts:
        raise ConfigError(f"`scontrol show hostnames {nodelist}` failed ({done.stderr.strip() or 'no hosts'})",
                          f"check the Slurm client's configuration (SLURM_CONF), or set {HOSTFILE_ENV} to a hostfile")
    if len(hosts) < nodes:
        raise ConfigError(f"cluster.nodes={nodes}, but this Slurm allocation ({SLURM_NODELIST_ENV}={nodelist}) has "
                          f"{len(hosts)} node(s): {', '.join(hosts)}",
                          f"submit with sbatch --nodes={nodes} (agentrl job submit --training with "
                          f"controlplane.executor: slurm does), or set cluster.nodes: {len(hosts)}")
    here = socket.gethostname()
    hosts = sorted(hosts, key=lambda h: h != here)  # the run's process is rank 0's host
    path = Path(control).absolute() / ALLOCATION_HOSTFILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{host} slots={per_node}\n" for host in hosts), encoding="utf-8")
    return path


def check_devices(cfg) -> None:
    """NCCL needs one GPU per rank on each host; refuse a world size the GPUs here cannot hold."""
    import torch

    per_node = cfg.training.world_size // cfg.cluster.nodes
    backend = cfg.training.dist_backend
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend == "nccl" and gpus == 0:
        raise ConfigError("training.dist_backend=nccl but this host has no GPU",
                          "set training.dist_backend: gloo (or auto) to train on CPU")
    if backend != "gloo" and 0 < gpus < per_node:
        raise ConfigError(f"training.world_size={cfg.training.world_size} puts {per_node} NCCL ranks on this host, "
                          f"which has {gpus} GPU(s)", f"set training.world_size to at most {gpus * cfg.cluster.nodes}, "
                          "or training.dist_backend: gloo")


def rank_environment(cfg, env: dict | None = None) -> dict[str, str]:
    """The launcher's environment: no rank variables of our own, gloo on loopback for one host, the
    CPU accelerator and a fair share of OpenMP threads without GPUs (`cpu_thread_split`), this
    checkout importable."""
    import torch

    env = dict(os.environ if env is None else env)
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    if cfg.cluster.nodes == 1:
        env.setdefault("GLOO_SOCKET_IFNAME", _loopback_ifname())
    if not torch.cuda.is_available():
        env.setdefault("DS_ACCELERATOR", "cpu")
        from agentrl_cli.engines.inference.launcher import cpu_thread_split

        env.setdefault("OMP_NUM_THREADS", str(cpu_thread_split(cfg)[0]))
    root = str(Path(rank_worker.__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    from agentrl_cli.core.logstreams import level_env

    env.update(level_env(cfg.observe.log_level))  # the run's log level, for rank_worker
    return env


def with_remote_environment(env: dict[str, str], control: Path) -> dict[str, str]:
    """`env` for the `deepspeed` launcher over several hosts: the REMOTE_VARIABLES it holds written to
    `<control>/deepspeed_env`, then the lines of the `.deepspeed_env` files the launcher would have
    read (in ~ and its working directory), and DS_ENV_FILE naming that file."""
    name = env.get(ENV_FILE_ENV, DEFAULT_ENV_FILE)
    lines = [f"{key}={env[key]}" for key in REMOTE_VARIABLES if env.get(key)]
    for base in (Path("~").expanduser(), Path.cwd()):
        own = base / name
        if own.is_file():
            lines += [line.strip() for line in own.read_text(encoding="utf-8").splitlines() if "=" in line]
    path = Path(control).absolute() / ENV_FILE
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return {**env, ENV_FILE_ENV: str(path)}


class RanksBackend:
    """`training.world_size` ranks under a launcher; this object stands for rank 0 in the run's
    process (`rank` 0, so weight sync talks to the servers from here)."""

    rank = 0

    def __init__(self, model_path: str | Path, cfg, run_dir: Path, *, start_timeout_s: float | None = None) -> None:
        self.world_size = cfg.training.world_size
        self.rank_timeout_s = cfg.training.rank_timeout_s
        self.lora = cfg.training.lora  # the ranks wrap their models with it (deepspeed_backend)
        check_devices(cfg)
        self.run_dir = Path(run_dir)
        self.control = self.run_dir / "trainer-ranks"
        self.log_path = self.run_dir / "logs" / "trainer-ranks.log"
        self._conn = self._proc = self._failure = None
        self._step, self.pids, self.hosts = 0, [], []
        self._lock = threading.Lock()  # one command on the channel at a time, whichever thread calls
        self._names: list | None = None
        shutil.rmtree(self.control, ignore_errors=True)
        self.control.mkdir(parents=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        (self.control / rank_worker.CONFIG_FILE).write_text(cfg.training.model_dump_json(), encoding="utf-8")
        self._authkey = secrets.token_bytes(32)
        key = self.control / rank_worker.AUTHKEY_FILE
        key.touch(mode=0o600)
        key.write_bytes(self._authkey)
        cmd = launcher_command(cfg, Path(model_path), self.control)
        env = rank_environment(cfg)
        if cfg.cluster.nodes > 1:
            env = with_remote_environment(env, self.control)
        with self.log_path.open("ab") as log:
            log.write(f"$ {' '.join(cmd)}\n".encode())
            self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                          env=env, start_new_session=True)
        try:
            self._connect(start_timeout_s or cfg.training.start_timeout_s)
        except BaseException:
            self.close()
            raise

    # ---- the channel -----------------------------------------------------------------------------

    def _connect(self, timeout_s: float) -> None:
        channel = self.control / rank_worker.CHANNEL_FILE
        deadline = time.monotonic() + timeout_s
        while not channel.exists():
            if self._proc.poll() is not None:
                raise self._failed("the trainer ranks exited before they opened their command channel")
            if time.monotonic() > deadline:
                raise self._failed(f"the trainer ranks did not open their command channel within {timeout_s:g} s "
                                   "(training.start_timeout_s: a rank never joined the rendezvous or is still loading)",
                                   hint="see the log for the rank that is missing; on several hosts check the hostfile "
                                   "and that every host reaches the first one; a big model may need a larger "
                                   "training.start_timeout_s", exiting=False)
            time.sleep(0.2)
        info = json.loads(channel.read_text(encoding="utf-8"))
        self.pids, self.hosts, self._step = info["pids"], info["hosts"], int(info["step"])
        self._conn = Client(("127.0.0.1", int(info["port"])), authkey=self._authkey)
        self._receive("hello", timeout_s, "training.start_timeout_s")

    def _call(self, name: str, timeout_s: float | None = None, **kwargs):
        """Rank 0's answer to `name`, within `timeout_s` (default: training.rank_timeout_s)."""
        key = "training.rank_timeout_s" if timeout_s is None else ""
        with self._lock:
            return self._exchange(name, self.rank_timeout_s if timeout_s is None else timeout_s, kwargs, key)

    def _exchange(self, name: str, timeout_s: float, kwargs: dict, key: str = ""):
        if self._failure is not None:
            raise self._failure
        if self._conn is None:
            raise TrainerRanksFailed("the trainer ranks were closed", "start a new backend")
        if self._proc.poll() is not None:
            raise self._failed(f"the trainer ranks' launcher exited before {name}")
        try:
            self._conn.send_bytes(pickle.dumps((name, kwargs)))
        except OSError:
            raise self._failed(f"the trainer ranks' channel closed before {name}") from None
        return self._receive(name, timeout_s, key)

    def _receive(self, name: str, timeout_s: float, key: str = ""):
        """Rank 0's answer; a launcher that exits meanwhile ends the wait (and so does `timeout_s`,
        the value of config `key` when it has one)."""
        deadline = time.monotonic() + timeout_s
        try:
            while not self._conn.poll(min(0.5, timeout_s)):
                if self._proc.poll() is not None and not self._conn.poll(0):
                    raise self._failed(f"the trainer ranks' launcher exited during {name}")
                if time.monotonic() > deadline:
                    raise self._failed(f"the trainer ranks did not answer {name} within {timeout_s:g} s"
                                       + (f" ({key})" if key else ""), exiting=False,
                                       hint="a rank hangs (a collective waiting on a peer, a stuck device, a file system "
                                       "that does not answer): see the log; the run restarts from its latest checkpoint"
                                       + (f"; raise {key} if the call is only slow" if key else ""))
            reply = pickle.loads(self._conn.recv_bytes())
        except (EOFError, OSError):
            raise self._failed(f"the trainer ranks' channel closed during {name}") from None
        self._step = int(reply["step"])
        if not reply["ok"]:
            raise _rebuild(reply["error"], reply["rank"], name)
        return reply["value"]

    def _failed(self, what: str, hint: str = "", *, exiting: bool = True) -> TrainerRanksFailed:
        """The error for a dead or missing rank, once the launcher (when `exiting`) has reported it."""
        if exiting:
            try:
                self._proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass
        text = self._log_text()
        failures = failed_ranks(text)
        tail = text[-LOG_TAIL_CHARS:]
        if failures and failures[0][1] < 0 and "Failures:" in text:  # a signal: the launcher's summary says it all
            tail = text[text.rindex("Failures:"):]
        hint = hint or "the run resumes from its last checkpoint when started again (training.resume_from_latest)"
        if failures:
            rank, status = failures[0]
            message = (f"trainer rank {rank} of {self.world_size} died (exit status {describe_status(status)}); "
                       f"{what}")
            error = TrainerRanksFailed(f"{message}\n{self.log_path} ends with:\n{tail}", hint, rank=rank, exit_status=status)
        else:
            status = self._proc.returncode
            code = "still running" if status is None else f"exit status {describe_status(status)}"
            error = TrainerRanksFailed(f"{what} (launcher {code})\n{self.log_path} ends with:\n{tail}", hint)
        self._failure = error
        self._stop()
        return error

    def _log_text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    # ---- TrainingBackend -------------------------------------------------------------------------

    @property
    def step(self) -> int:
        return self._step

    def train_step(self, samples: list) -> dict:
        if not samples:
            raise ValueError("train_step: no samples; pass at least one")
        return self._call("train_step", samples=list(samples))

    def save_checkpoint(self, dir: Path, client_state: dict) -> None:
        self._call("save_checkpoint", dir=str(Path(dir).absolute()), client_state=dict(client_state))

    def load_checkpoint(self, dir: Path) -> dict:
        return self._call("load_checkpoint", dir=str(Path(dir).absolute()))

    def export_weights(self, dir: Path) -> Path:
        return Path(self._call("export_weights", dir=str(Path(dir).absolute())))

    def export_adapter(self, dir: Path) -> Path:
        """peft's adapter directory, written by rank 0 (training.lora only)."""
        return Path(self._call("export_adapter", dir=str(Path(dir).absolute())))

    def parameter_names(self) -> list[tuple[str, tuple[int, ...]]]:
        if self._names is None:  # fixed for the model's life; weight sync asks at every sync
            self._names = [(name, tuple(shape)) for name, shape in self._call("parameter_names")]
        return list(self._names)

    def named_parameter_sample(self, names: list[str], n: int) -> dict[str, list[float]]:
        return self._call("named_parameter_sample", names=list(names), n=n)

    def named_tensors(self) -> dict:
        """Full CPU copies of every parameter (rank 0's, gathered by all ranks under ZeRO-3)."""
        return self._call("named_tensors")

    def close(self) -> None:
        """Tell the ranks to leave, wait for the launcher, and stop whatever is left (every rank)."""
        leaving = False
        if self._conn is not None and self._failure is None and self._proc.poll() is None:
            try:
                self._call("close", STOP_TIMEOUT_S)
                leaving = True
            except AgentrlError:
                pass
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._stop(STOP_TIMEOUT_S if leaving else 5)

    def _stop(self, grace_s: float = 5) -> None:
        """Wait `grace_s` for the launcher to exit, then SIGTERM (torchrun stops its ranks), then
        SIGKILL; finally kill any rank of this host still alive."""
        proc = self._proc
        if proc is None:
            return
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGTERM)  # torchrun stops its ranks on SIGTERM
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                _signal_group(proc.pid, signal.SIGKILL)
                proc.wait()
        here = socket.gethostname()
        local = [pid for pid, host in zip(self.pids, self.hosts) if host == here]
        for pid in local:  # each rank leads its own session; none outlives the run
            if _is_rank(pid):
                _signal_group(pid, signal.SIGKILL)
        self._wait_gone(local)

    @staticmethod
    def _wait_gone(pids: list[int], timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while any(_is_rank(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)


def _is_rank(pid: int) -> bool:
    """True while `pid` is a live (not zombie) rank_worker process."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return rank_worker.__name__.encode() in cmdline and state != "Z"


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _rebuild(error: dict, rank: int, name: str) -> Exception:
    """The exception a rank raised, as its own type where that is an agentrl error or a builtin."""
    module, _, qualname = error["type"].partition(":")
    message = error["message"]
    try:
        cls = getattr(sys.modules.get(module) or __import__(module, fromlist=[qualname]), qualname)
    except (ImportError, AttributeError):
        cls = None
    if isinstance(cls, type) and issubclass(cls, AgentrlError):
        return cls(message, error.get("hint", ""))
    if isinstance(cls, type) and module == "builtins" and issubclass(cls, Exception):
        return cls(message)
    return TrainerRanksFailed(f"trainer rank {rank} failed in {name}: {message}\n{error['traceback'][-LOG_TAIL_CHARS:]}",
                              "see the traceback; it is a bug in the trainer or its input", rank=rank)
