"""All-reduce bus bandwidth across ranks, in the nccl-tests convention, with a deadline.

The ranks are started through torch's own launcher (`python -m torch.distributed.run`, what
`torchrun` and training use): N local ranks on one host, or this node's share of a multi-node
rendezvous (`nnodes`, `node_rank`, `master_addr`). For a message of S bytes taking t seconds per
call (the mean of the fastest of `rounds` timed rounds, on the slowest rank), algbw = S / t and
busbw = algbw * 2(n-1)/n, in GB/s (1e9 bytes), as nccl-tests reports them.

A run that has not finished by the deadline is killed with every rank it started, and the result
names the ranks that never arrived (no sign of life before joining the process group) or the phase
the others were stuck in. Belongs here: launching, the deadline, reading the ranks' files, judging.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from agentrl_cli.core.report import Check, CheckStatus

DEFAULT_SIZES = (4 << 10, 64 << 10, 1 << 20, 4 << 20)
BYTES_PER_SIZE = 16 << 20  # timed bytes per round and message size: iterations = this / size, within [5, 50]
SUFFIX = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_size(text: str) -> int:
    """'4096', '64K', '4M', '1G' (powers of 1024) -> bytes."""
    t = text.strip().lower().removesuffix("b").removesuffix("i")
    mult = SUFFIX.get(t[-1:], 1)
    try:
        value = int(float(t[:-1] if t[-1:] in SUFFIX else t) * mult)
    except ValueError:
        raise ValueError(f"bad message size {text!r}: use bytes or a K/M/G suffix, e.g. 64K,4M") from None
    if value < 4:
        raise ValueError(f"message size {text!r} is below one float32 (4 bytes)")
    return value


def iterations_for(size: int) -> int:
    return max(5, min(50, BYTES_PER_SIZE // size))


def bus_factor(world: int) -> float:
    return 2 * (world - 1) / world


def figures(nbytes: int, time_s: float, world: int) -> dict:
    """nccl-tests figures for one message size: time in microseconds, algbw and busbw in GB/s."""
    algbw = nbytes / time_s / 1e9
    return {"time_us": round(time_s * 1e6, 1), "algbw_gbps": round(algbw, 4), "busbw_gbps": round(algbw * bus_factor(world), 4)}


@dataclass
class AllreduceSpec:
    ranks: int = 2  # ranks on this node
    sizes: tuple[int, ...] = DEFAULT_SIZES
    backend: str = "gloo"
    deadline_s: float = 120.0
    warmup: int = 2
    iters: int | None = None  # None: iterations_for(size)
    rounds: int = 3  # timed rounds per size; the fastest round's mean per call counts
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int | None = None  # None: a free port on this host
    python: str = sys.executable
    env: dict[str, str] = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        return self.ranks * self.nnodes


@dataclass
class AllreduceResult:
    ok: bool
    world_size: int
    backend: str
    rows: list[dict] = field(default_factory=list)  # bytes, count, iters, time_us, algbw_gbps, busbw_gbps, correct
    elapsed_s: float = 0.0
    timed_out: bool = False
    missing_ranks: list[int] = field(default_factory=list)  # never arrived before the deadline
    stuck: dict[int, str] = field(default_factory=dict)  # rank -> last phase reached
    error: str = ""
    command: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def peak_busbw_gbps(self) -> float | None:
        return max((r["busbw_gbps"] for r in self.rows), default=None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launcher_command(spec: AllreduceSpec, out: Path, port: int) -> list[str]:
    iters = [spec.iters or iterations_for(s) for s in spec.sizes]
    return [spec.python, "-m", "torch.distributed.run", "--nnodes", str(spec.nnodes), "--node-rank", str(spec.node_rank),
            "--nproc-per-node", str(spec.ranks), "--master-addr", spec.master_addr, "--master-port", str(port),
            "-m", "agentrl_cli.ops.bench.allreduce_worker", "--out", str(out), "--backend", spec.backend,
            "--sizes", ",".join(map(str, spec.sizes)), "--iters", ",".join(map(str, iters)),
            "--warmup", str(spec.warmup), "--rounds", str(spec.rounds), "--timeout", str(max(1, int(spec.deadline_s)))]


def run_allreduce(spec: AllreduceSpec) -> AllreduceResult:
    """Start the ranks, wait at most `deadline_s`, and read what they measured or where they stopped."""
    with tempfile.TemporaryDirectory(prefix="agentrl-allreduce-") as tmp:
        out = Path(tmp)
        cmd = launcher_command(spec, out, spec.master_port or _free_port())
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), **spec.env}
        t0 = time.monotonic()
        with open(out / "launcher.log", "wb") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            try:
                code = proc.wait(timeout=spec.deadline_s)
                timed_out = False
            except subprocess.TimeoutExpired:
                _kill_tree(proc)
                code, timed_out = None, True
        elapsed = time.monotonic() - t0
        marks = _read_marks(out)
        tail = (out / "launcher.log").read_bytes()[-3000:].decode("utf-8", "replace")
        result = AllreduceResult(ok=False, world_size=spec.world_size, backend=spec.backend, elapsed_s=round(elapsed, 2),
                                 timed_out=timed_out, command=cmd)
        local = range(spec.node_rank * spec.ranks, (spec.node_rank + 1) * spec.ranks)
        if timed_out:
            result.missing_ranks = [r for r in range(spec.world_size) if r not in marks]
            result.stuck = {r: m["phase"] for r, m in sorted(marks.items()) if m["phase"] != "done"}
            others = [r for r in result.missing_ranks if r not in local]
            result.error = (f"not finished within {spec.deadline_s:g} s; killed. "
                            + (f"never joined: rank {', '.join(map(str, result.missing_ranks))}"
                               + (f" (ranks {others[0]}..{others[-1]} belong to other nodes)" if others else "") + "; "
                               if result.missing_ranks else "every rank arrived; ")
                            + ("last phase per rank: " + ", ".join(f"rank {r}: {p}" for r, p in result.stuck.items())
                               if result.stuck else ""))
            return result
        result_file = out / "result.json"
        if code != 0 or not result_file.exists():
            result.error = f"the launcher exited with code {code}; last output:\n{tail.strip()}"
            return result
        data = json.loads(result_file.read_text())
        for row in data["rows"]:
            result.rows.append({"bytes": row["bytes"], "count": row["count"], "iters": row["iters"], "rounds": row["rounds"],
                                **figures(row["bytes"], row["time_s"], data["world_size"]), "correct": row["correct"]})
        result.ok = all(r["correct"] for r in result.rows)
        if not result.ok:
            bad = [r["bytes"] for r in result.rows if not r["correct"]]
            result.error = f"all-reduce returned wrong sums for message sizes {bad}"
        return result


def _kill_tree(proc: subprocess.Popen) -> None:
    """Kill the launcher and every rank it started (ranks run in sessions of their own)."""
    import psutil

    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    for p in children:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    proc.wait(timeout=30)
    psutil.wait_procs(children, timeout=10)


def _read_marks(out: Path) -> dict[int, dict]:
    marks = {}
    for p in out.glob("rank-*.json"):
        try:
            m = json.loads(p.read_text())
            marks[int(m["rank"])] = m
        except (OSError, ValueError, KeyError):
            continue
    return marks


def checks(result: AllreduceResult, min_busbw_gbps: float) -> list[Check]:
    """Completion (with the ranks named on a hang), correctness, and bus bandwidth vs the threshold."""
    hint_hang = ("a rank that never joins: check that every node runs the launcher with the same --nnodes and "
                 "--master-addr/--master-port, that the port is open between nodes and that the rank's host is up; "
                 "`agentrl troubleshoot \"collective communication stuck\"`")
    if result.timed_out:
        return [Check("all-reduce completes", CheckStatus.FAIL, {"missing_ranks": result.missing_ranks, "stuck": result.stuck,
                                                        "elapsed_s": result.elapsed_s},
                      "every rank joins and finishes before the deadline", result.error, hint_hang)]
    if result.error and not result.rows:
        return [Check("all-reduce completes", CheckStatus.FAIL, None, "the launcher exits 0 with results", result.error,
                      "see the launcher output above; `python -m torch.distributed.run --help` for the launcher")]
    done = Check("all-reduce completes", CheckStatus.PASS, {"world_size": result.world_size, "backend": result.backend,
                                                   "elapsed_s": result.elapsed_s}, "every rank joins and finishes")
    correct = Check.judge("all-reduce sums correct", all(r["correct"] for r in result.rows),
                          {r["bytes"]: r["correct"] for r in result.rows},
                          "every element equals n(n+1)/2 after rank r contributes r+1",
                          "wrong collective results: check the NCCL/gloo versions match on every node (`agentrl image verify`)",
                          result.error)
    table = [{k: r[k] for k in ("bytes", "time_us", "algbw_gbps", "busbw_gbps")} for r in result.rows]
    peak = result.peak_busbw_gbps
    if result.world_size < 2:
        bw = Check.skipped("all-reduce bus bandwidth", "one rank: an all-reduce moves no data between ranks (busbw factor 0)",
                           f">= {min_busbw_gbps:g} GB/s", "run with 2 or more ranks")
        bw.measured = table
        return [done, correct, bw]
    bw = Check.judge("all-reduce bus bandwidth", peak is not None and peak >= min_busbw_gbps, table,
                     f"peak busbw >= {min_busbw_gbps:g} GB/s (stages.allreduce_min_gbps; busbw = algbw*2(n-1)/n)",
                     "slow collectives: check the interconnect and NCCL_SOCKET_IFNAME/NCCL_IB_* settings, or lower "
                     "stages.allreduce_min_gbps to what this cluster is meant to deliver",
                     f"peak busbw {peak:g} GB/s over {result.world_size} ranks ({result.backend})")
    return [done, correct, bw]


def sizes_up_to(max_bytes: int) -> tuple[int, ...]:
    """4 KiB, 64 KiB, 1 MiB, ... (x16) up to and including `max_bytes`."""
    sizes, s = [], 4 << 10
    while s < max_bytes:
        sizes.append(s)
        s *= 16
    return tuple(sizes + [max_bytes])


def spec_from_config(cfg, **overrides) -> AllreduceSpec:
    """Stage 1's run: stages.allreduce_ranks ranks on this host (0 = one per GPU, else 2), the
    training backend (auto = nccl with GPUs, gloo without), sizes up to stages.allreduce_max_mb."""
    st, gpus = cfg.stages, cfg.cluster.gpus_per_node
    backend = cfg.training.dist_backend if cfg.training.dist_backend != "auto" else ("nccl" if gpus else "gloo")
    ranks = st.allreduce_ranks or (gpus or 2)
    spec = AllreduceSpec(ranks=ranks, sizes=sizes_up_to(int(st.allreduce_max_mb * (1 << 20))), backend=backend,
                         deadline_s=st.allreduce_timeout_s)
    for k, v in overrides.items():
        setattr(spec, k, v)
    return spec
