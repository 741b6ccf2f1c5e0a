"""A control-plane instance: holds or watches the leader lease and, while leader, reconciles the job
registry with the executor (hands queued jobs over, acts on cancel requests, records state changes,
each write fenced with its term).

`serve()` is the long-running loop of `agentrl controlplane serve` (renew every lease/3 seconds);
`step()` is one round, which the job commands also run once when no leader is live, so the queue
moves on one box without a daemon. Several instances share one store; exactly one is leader.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from agentrl_cli.config.models import PlatformConfig
from agentrl_cli.ops.controlplane.executor import ACTIVE, CANCELLED, FINISHED, PENDING, QUEUED, RUNNING, Executor
from agentrl_cli.ops.controlplane.executors import executor_from_config
from agentrl_cli.ops.controlplane.lease import LeaderLease, LeaseState, cluster_view, new_instance_id
from agentrl_cli.ops.controlplane.registry import Registry, spec_of
from agentrl_cli.ops.controlplane.store import LEASE_NAME, FencedOut, StateStore

log = logging.getLogger("agentrl.controlplane")


def open_store(cfg: PlatformConfig) -> StateStore:
    return StateStore(cfg.controlplane.state_store)


class ControlPlane:
    def __init__(self, cfg: PlatformConfig, store: StateStore, executor: Executor | None = None,
                 instance_id: str | None = None, lease_name: str = LEASE_NAME, dispatch: bool = True) -> None:
        self.cfg, self.store = cfg, store
        self.executor = executor if executor is not None else executor_from_config(cfg)
        self.registry = Registry(store)
        self.lease = LeaderLease(store, instance_id or new_instance_id(), cfg.controlplane.lease_seconds, lease_name)
        self.dispatch = dispatch
        self.state: LeaseState | None = None
        self.started_at = time.monotonic()
        self.last_ok: float | None = None  # monotonic time of the last step that reached the store

    @property
    def instance_id(self) -> str:
        return self.lease.instance_id

    @property
    def interval_s(self) -> float:
        return self.cfg.controlplane.lease_seconds / 3

    def step(self) -> LeaseState:
        """Renew or take the lease; while leader, reconcile once. A deposed leader stops writing."""
        self.state = self.lease.try_acquire()
        if self.state.leader and self.dispatch:
            try:
                self.reconcile(self.state.term)
            except FencedOut as exc:
                log.warning("%s: %s", self.instance_id, exc.message)
                self.lease.term = 0
        return self.state

    def reconcile(self, token: int) -> None:
        jobs = self.registry.jobs(ACTIVE)
        for job in jobs:
            if job["cancel_requested"]:
                if job["external_id"]:
                    self.executor.cancel(job["external_id"])
                else:
                    self.registry.update_job(token, job["id"], state=CANCELLED, reason="cancelled before it was submitted",
                                             ended_at=time.time())
            elif job["state"] == QUEUED and not job["external_id"]:
                external = self.executor.submit(spec_of(job))
                self.registry.update_job(token, job["id"], state=PENDING, external_id=external)
                job["external_id"], job["state"] = external, PENDING
        live = {j["external_id"]: j for j in jobs if j["external_id"]}
        if not live:
            return
        for external, status in self.executor.poll(list(live)).items():
            job = live[external]
            fields = {"state": status.state, "reason": status.reason, "restarts": status.restarts}
            if status.pool:
                fields["pool"] = status.pool
            if status.state in (RUNNING, *FINISHED) and not job.get("started_at") and (status.state == RUNNING or status.started_at):
                fields["started_at"] = status.started_at or time.time()
            if status.state in FINISHED:
                fields["exit_code"] = status.exit_code
                fields["ended_at"] = time.time()
            if any(job.get(k) != v for k, v in fields.items()):
                self.registry.update_job(token, job["id"], **fields)

    def serve(self, stop: threading.Event, on_change: Callable[[LeaseState], None] | None = None) -> None:
        """Run until `stop` is set; release the lease on the way out so a follower takes over at once."""
        last = None
        try:
            while not stop.is_set():
                try:
                    state = self.step()
                    self.last_ok = time.monotonic()
                except Exception as exc:  # noqa: BLE001 - a store or scheduler hiccup must not end the instance
                    log.warning("%s: step failed: %s", self.instance_id, exc)
                    self.lease.term = 0  # without a confirmed lease this instance writes nothing
                    state = None
                    try:
                        self.store.reconnect()
                    except Exception as again:  # noqa: BLE001 - still down: try again next round
                        log.warning("%s: state store still unreachable: %s", self.instance_id, again)
                key = (state.leader, state.term, state.holder) if state else None
                if on_change and state and key != last:
                    on_change(state)
                last = key
                stop.wait(self.interval_s)
        finally:
            try:
                self.lease.release() if self.lease.term else self.lease.leave()
            except Exception as exc:  # noqa: BLE001 - the store may be gone; the lease then simply expires
                log.warning("%s: could not release the lease: %s", self.instance_id, exc)

    def status(self) -> dict:
        return cluster_view(self.store, self.cfg.controlplane.lease_seconds, self.lease.name)


def job_counts(store: StateStore) -> dict[str, int]:
    return {r["state"]: int(r["n"]) for r in store.query("SELECT state, count(*) AS n FROM jobs GROUP BY state")}


def advance_once(cfg: PlatformConfig, store: StateStore, executor: Executor | None = None) -> dict:
    """One reconcile round as a short-lived instance when no leader is live (the job commands use it);
    with a live leader, leave the work to it. Returns what happened."""
    cp = ControlPlane(cfg, store, executor)
    state = cp.step()
    if state.leader:
        cp.lease.release()
        return {"reconciled_by": "this command", "term": state.term}
    cp.lease.leave()
    return {"reconciled_by": state.holder, "term": state.term}


def wait_for(registry: Registry, job_id: str, until: Callable[[dict], bool], timeout_s: float,
             tick: Callable[[], object] | None = None, interval_s: float = 0.2) -> dict:
    """Poll a job until `until(job)` holds or the deadline passes; `tick` advances the queue meanwhile."""
    deadline = time.monotonic() + timeout_s
    while True:
        if tick:
            tick()
        job = registry.job(job_id)
        if until(job) or time.monotonic() >= deadline:
            return job
        time.sleep(interval_s)
