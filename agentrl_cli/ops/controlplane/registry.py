"""The experiment and job registry: experiments, runs, config versions and hashes, stage and verify
results, and jobs with their states, kept in the state store.

Submitting a job and asking for a cancel are requests any client may make (an insert, a flag).
Everything else - handing a job to the executor, its state changes, recorded results - is a leader's
write and carries the leader's fencing token (store.fenced refuses a stale one).
"""

from __future__ import annotations

import json
import os
import time
import uuid

from agentrl_cli.ops.controlplane.executor import ACTIVE, QUEUED, JobSpec
from agentrl_cli.ops.controlplane.store import LEASE_NAME, StateStore
from agentrl_cli.core.errors import NotFoundError

JOB_COLUMNS = ("state", "reason", "external_id", "exit_code", "restarts", "pool", "started_at", "ended_at")


def new_job_id() -> str:
    return f"j{time.strftime('%Y%m%d%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:6]}"


class Registry:
    """Reads and writes of the registry tables; leader writes are fenced against the lease named `lease`."""

    def __init__(self, store: StateStore, lease: str = LEASE_NAME) -> None:
        self.store, self.lease = store, lease

    # -- requests (any client) -------------------------------------------------------------------
    def submit_job(self, pool: str, priority: str, priority_value: int, command: list[str], cpus: int, executor: str,
                   log_dir: str, nodes: int = 1) -> dict:
        job_id = new_job_id()
        now = time.time()
        log_path = os.path.join(os.path.abspath(log_dir), f"{job_id}.log")  # absolute: the scheduler may run elsewhere
        with self.store.transaction() as tx:
            tx.execute("INSERT INTO jobs (id, pool, priority, priority_value, command_json, cpus, state, executor, log_path,"
                       " submitted_at, updated_at, cancel_requested, nodes) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, ?)",
                       (job_id, pool, priority, priority_value, json.dumps(command), cpus, QUEUED, executor, log_path, now, now,
                        nodes))
        return self.job(job_id)

    def request_cancel(self, job_id: str) -> dict:
        self.job(job_id)
        with self.store.transaction() as tx:
            tx.execute("UPDATE jobs SET cancel_requested = 1, updated_at = ? WHERE id = ?", (time.time(), job_id))
        return self.job(job_id)

    # -- reads -----------------------------------------------------------------------------------
    def job(self, job_id: str) -> dict:
        rows = self.store.query("SELECT * FROM jobs WHERE id = ?", (job_id,))
        if not rows:
            raise NotFoundError(f"job {job_id!r} does not exist in {self.store.display_url}", "list jobs with `agentrl job list`")
        return _job(rows[0])

    def jobs(self, states: tuple[str, ...] | None = None, limit: int = 200) -> list[dict]:
        if states:
            marks = ", ".join("?" for _ in states)
            rows = self.store.query(f"SELECT * FROM jobs WHERE state IN ({marks}) OR cancel_requested = 1 AND state IN "
                                    f"({', '.join('?' for _ in ACTIVE)}) ORDER BY submitted_at DESC LIMIT {int(limit)}",
                                    (*states, *ACTIVE))
        else:
            rows = self.store.query(f"SELECT * FROM jobs ORDER BY submitted_at DESC LIMIT {int(limit)}")
        return [_job(r) for r in rows]

    def results(self, run_id: str) -> list[dict]:
        return self.store.query("SELECT run_id, kind, name, status, recorded_at, fence FROM results WHERE run_id = ? "
                                "ORDER BY recorded_at", (run_id,))

    # -- leader writes (fenced) ------------------------------------------------------------------
    def update_job(self, token: int, job_id: str, **fields) -> None:
        unknown = set(fields) - set(JOB_COLUMNS)
        if unknown:
            raise ValueError(f"not job columns: {sorted(unknown)}")
        sets = ", ".join(f"{k} = ?" for k in fields)
        with self.store.fenced(token, self.lease) as tx:
            tx.execute(f"UPDATE jobs SET {sets}, updated_at = ?, fence = ? WHERE id = ?",
                       (*fields.values(), time.time(), token, job_id))

    def record_run(self, token: int, run_id: str, experiment: str, config_hash: str, config: dict) -> None:
        now = time.time()
        with self.store.fenced(token, self.lease) as tx:
            if not tx.one("SELECT name FROM experiments WHERE name = ?", (experiment,)):
                tx.execute("INSERT INTO experiments (name, created_at) VALUES (?, ?)", (experiment, now))
            if not tx.one("SELECT hash FROM config_versions WHERE hash = ?", (config_hash,)):
                tx.execute("INSERT INTO config_versions (hash, config_json, created_at) VALUES (?, ?, ?)",
                           (config_hash, json.dumps(config, sort_keys=True, default=str), now))
            if not tx.one("SELECT run_id FROM runs WHERE run_id = ?", (run_id,)):
                tx.execute("INSERT INTO runs (run_id, experiment, config_hash, created_at) VALUES (?, ?, ?, ?)",
                           (run_id, experiment, config_hash, now))

    def record_result(self, token: int, run_id: str, kind: str, name: str, status: str, report: dict) -> None:
        with self.store.fenced(token, self.lease) as tx:
            tx.execute("DELETE FROM results WHERE run_id = ? AND kind = ? AND name = ?", (run_id, kind, name))
            tx.execute("INSERT INTO results (run_id, kind, name, status, report_json, recorded_at, fence) VALUES (?, ?, ?, ?, ?, ?, ?)",
                       (run_id, kind, name, status, json.dumps(report, default=str), time.time(), token))


def spec_of(job: dict) -> JobSpec:
    return JobSpec(job_id=job["id"], pool=job["pool"], priority=job["priority"], priority_value=int(job["priority_value"]),
                   command=list(job["command"]), cpus=int(job["cpus"]), log_path=job["log_path"], nodes=int(job.get("nodes") or 1))


def _job(row: dict) -> dict:
    job = dict(row)
    job["command"] = json.loads(job.pop("command_json"))
    job["cancel_requested"] = bool(job.get("cancel_requested"))
    for k in ("priority_value", "cpus", "restarts", "fence", "nodes"):
        job[k] = int(job[k]) if job.get(k) is not None else None
    if job.get("exit_code") is not None:
        job["exit_code"] = int(job["exit_code"])
    return job
