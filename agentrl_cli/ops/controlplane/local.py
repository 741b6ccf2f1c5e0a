"""The local executor: jobs as subprocesses on this box. Small on purpose; production uses Slurm or Kueue.

Each pool has `capacity` CPU slots and runs at most `quota` jobs at once. Waiting jobs start in
priority order (higher value first, then submission order) with no backfill: when the head of a
pool's queue cannot start, nothing behind it does, and every waiting job carries the reason
(Quota, Resources, PoolConfig or Priority). It never preempts a running job.

State lives in a spool directory (`<jobs_dir>/local/<job id>/`: spec.json, pid, exit, cancelled) so
any process (a `controlplane serve` leader or a one-shot CLI command) can advance the queue; a file
lock keeps two of them from starting the same job.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

from agentrl_cli.config.models import ControlPlaneConfig
from agentrl_cli.ops.controlplane.executor import CANCELLED, FAILED, PENDING, RUNNING, SUCCEEDED, JobSpec, JobStatus

# Runs the command, then writes its exit status atomically to the path given as $0.
WRAPPER = 'rc=0; "$@" || rc=$?; echo "$rc" > "$0.tmp" && mv "$0.tmp" "$0"; exit "$rc"'


class LocalExecutor:
    name = "local"

    def __init__(self, cp: ControlPlaneConfig) -> None:
        self.cp = cp
        self.spool = Path(cp.jobs_dir) / "local"
        self._procs: dict[str, subprocess.Popen] = {}

    def check(self) -> None:
        self.spool.mkdir(parents=True, exist_ok=True)

    def preemption(self) -> str:
        return ("the local executor never preempts a running job (priority orders its queue only); "
                "preemption is Slurm's or Kueue's (controlplane.executor: slurm or kubernetes)")

    def submit(self, spec: JobSpec) -> str:
        d = self.spool / spec.job_id
        if (d / "spec.json").exists():  # handed over before a leader change: do not queue it twice
            return spec.job_id
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / "spec.json.tmp"
        tmp.write_text(json.dumps({**spec.__dict__, "submitted": time.time()}), encoding="utf-8")
        tmp.replace(d / "spec.json")
        self.poll([spec.job_id])
        return spec.job_id

    def poll(self, external_ids: list[str]) -> dict[str, JobStatus]:
        with self._locked():
            statuses = self._schedule()
        return {i: statuses[i] for i in external_ids if i in statuses}

    def cancel(self, external_id: str) -> None:
        d = self.spool / external_id
        if not d.is_dir():
            return
        with self._locked():
            (d / "cancelled").touch()
            pid = _read_int(d / "pid")
        if pid and _alive(pid, d):
            _kill_group(pid, d, self._procs.get(external_id))

    def logs(self, external_id: str, spec: JobSpec) -> str:
        path = Path(spec.log_path)
        return path.read_text(encoding="utf-8", errors="replace") if path.is_file() else ""

    # -- scheduling ------------------------------------------------------------------------------
    @contextmanager
    def _locked(self):
        self.spool.mkdir(parents=True, exist_ok=True)
        with open(self.spool / ".lock", "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def _schedule(self) -> dict[str, JobStatus]:
        statuses: dict[str, JobStatus] = {}
        waiting: dict[str, list[dict]] = {p.name: [] for p in self.cp.pools}
        running: dict[str, list[dict]] = {p.name: [] for p in self.cp.pools}
        for d in sorted(p for p in self.spool.iterdir() if (p / "spec.json").is_file()):
            spec = json.loads((d / "spec.json").read_text(encoding="utf-8"))
            status = self._observe(d, spec)
            if status is None:
                waiting.setdefault(spec["pool"], []).append(spec)
            else:
                statuses[spec["job_id"]] = status
                if status.state == RUNNING:
                    running.setdefault(spec["pool"], []).append(spec)
        for pool in sorted(self.cp.pools, key=lambda p: -p.priority):
            queue = sorted(waiting.get(pool.name, []), key=lambda s: (-s["priority_value"], s["submitted"]))
            busy_cpus = sum(s["cpus"] for s in running[pool.name])
            blocked = ""
            for n, spec in enumerate(queue):
                if not blocked:
                    if spec["cpus"] > pool.capacity:
                        blocked = f"PoolConfig: asks for {spec['cpus']} CPUs, pool {pool.name} has {pool.capacity}"
                    elif len(running[pool.name]) >= pool.quota:
                        blocked = f"Quota: pool {pool.name} runs {len(running[pool.name])} of its quota of {pool.quota} jobs"
                    elif busy_cpus + spec["cpus"] > pool.capacity:
                        blocked = f"Resources: pool {pool.name} has {pool.capacity - busy_cpus} of {pool.capacity} CPUs free"
                    else:
                        self._start(self.spool / spec["job_id"], spec)
                        running[pool.name].append(spec)
                        busy_cpus += spec["cpus"]
                        statuses[spec["job_id"]] = JobStatus(RUNNING, "", pool.name)
                        continue
                    statuses[spec["job_id"]] = JobStatus(PENDING, blocked, pool.name)
                else:
                    statuses[spec["job_id"]] = JobStatus(PENDING, f"Priority: waits behind {n} job(s) of pool {pool.name} "
                                                                  f"({blocked.split(':')[0]})", pool.name)
        for pool_name, queue in waiting.items():  # a pool removed from the config after its jobs were queued
            for spec in queue:
                statuses.setdefault(spec["job_id"], JobStatus(PENDING, f"PoolConfig: pool {pool_name} is not configured", pool_name))
        return statuses

    def _observe(self, d: Path, spec: dict) -> JobStatus | None:
        """The state of a started or cancelled job; None while it waits to start."""
        pool, exit_code, pid = spec["pool"], _read_int(d / "exit"), _read_int(d / "pid")
        proc = self._procs.get(spec["job_id"])
        if proc is not None and proc.poll() is not None:
            self._procs.pop(spec["job_id"], None)
        if (d / "cancelled").exists():
            if pid and _alive(pid, d):
                return JobStatus(RUNNING, "cancelling", pool)
            return JobStatus(CANCELLED, "cancelled by request", pool, exit_code)
        if pid is None:
            return None
        if exit_code is not None:
            return JobStatus(SUCCEEDED if exit_code == 0 else FAILED, "" if exit_code == 0 else f"exit code {exit_code}", pool,
                             exit_code, started_at=(d / "pid").stat().st_mtime)
        if _alive(pid, d):
            return JobStatus(RUNNING, "", pool)
        return JobStatus(FAILED, "the process ended without an exit status (killed from outside)", pool)

    def _start(self, d: Path, spec: dict) -> None:
        log = Path(spec["log_path"] or d / "output.log")
        log.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **spec.get("env", {}), "AGENTRL_JOB_ID": spec["job_id"], "AGENTRL_JOB_POOL": spec["pool"],
               "AGENTRL_JOB_PRIORITY": spec["priority"]}
        with open(log, "ab") as out:
            proc = subprocess.Popen(["/bin/sh", "-c", WRAPPER, str(d / "exit"), *spec["command"]], stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self._procs[spec["job_id"]] = proc
        (d / "pid").write_text(f"{proc.pid} {_start_ticks(proc.pid)}", encoding="utf-8")


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text(encoding="utf-8").split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _start_ticks(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _alive(pid: int, d: Path) -> bool:
    """True while the job's process runs (not a zombie, and not another process that reused the pid)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat.rsplit(")", 1)[1].split()
    recorded = (d / "pid").read_text(encoding="utf-8").split()
    if len(recorded) > 1 and fields[19] != recorded[1]:
        return False
    return fields[0] != "Z"


def _kill_group(pid: int, d: Path, proc: subprocess.Popen | None, grace_s: float = 5.0) -> None:
    """SIGTERM the job's process group; SIGKILL whatever is left once the job's shell ends or the grace runs out."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _alive(pid, d):
        if proc is not None:
            proc.poll()  # reap our own child so it does not linger as a zombie
        time.sleep(0.05)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
