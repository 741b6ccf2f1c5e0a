"""Job probes: submit real jobs through the registry and the configured executor and judge what the
scheduler did with them (stage 3's job checks). Each probe returns a Check; `cleanup()` cancels every
job the probes submitted and waits for them to end.

Pools are chosen from the config: the no-op job goes to the first pool; the quota probe uses a pool
whose quota is below its capacity when there is one (so the quota, not the CPUs, binds); the
preemption probe fills the lowest preemptible tier and submits to a higher tier a job that needs all
of that tier's CPUs.
"""

from __future__ import annotations

import time
from typing import Callable

from agentrl_cli.config.models import PlatformConfig, PoolConfig
from agentrl_cli.ops.controlplane.executor import FINISHED, PENDING, RUNNING, SUCCEEDED, Executor, priority_value
from agentrl_cli.ops.controlplane.registry import Registry, spec_of
from agentrl_cli.ops.controlplane.service import advance_once
from agentrl_cli.ops.controlplane.store import StateStore
from agentrl_cli.core.report import Check, CheckStatus

NOOP = ["sh", "-c", 'echo "agentrl no-op job in pool ${AGENTRL_JOB_POOL} (slurm partition ${SLURM_JOB_PARTITION:-none})"']
SLEEPER = ["sleep", "600"]
DEADLINE_S = 90.0


class JobProbe:
    def __init__(self, cfg: PlatformConfig, store: StateStore, executor: Executor,
                 progress: Callable[[str], None] = lambda m: None) -> None:
        self.cfg, self.cp, self.store, self.executor, self.progress = cfg, cfg.controlplane, store, executor, progress
        self.registry = Registry(store)
        self.submitted: list[str] = []
        self._blockers: list[str] = []
        self._quota_pool: PoolConfig | None = None

    # -- plumbing --------------------------------------------------------------------------------
    def tick(self) -> None:
        advance_once(self.cfg, self.store, self.executor)

    def submit(self, pool: str, command: list[str], priority: str | None = None, cpus: int = 1) -> str:
        name, value = priority_value(self.cp, priority)
        job = self.registry.submit_job(pool, name, value, command, cpus, self.cp.executor, self.cp.jobs_dir)
        self.submitted.append(job["id"])
        return job["id"]

    def wait(self, ok: Callable[[dict[str, dict]], bool], ids: list[str], deadline_s: float = DEADLINE_S) -> dict[str, dict]:
        deadline = time.monotonic() + deadline_s
        while True:
            self.tick()
            jobs = {i: self.registry.job(i) for i in ids}
            if ok(jobs) or time.monotonic() >= deadline:
                return jobs
            time.sleep(0.25)

    def cancel(self, ids: list[str]) -> None:
        live = [i for i in ids if self.registry.job(i)["state"] not in FINISHED]
        for i in live:
            self.registry.request_cancel(i)
        if live:
            self.wait(lambda js: all(j["state"] in FINISHED for j in js.values()), live, 60.0)

    def cleanup(self) -> None:
        self.cancel(self.submitted)

    # -- probes ----------------------------------------------------------------------------------
    def noop(self) -> Check:
        pool = self.cp.pools[0].name
        self.progress(f"no-op job in pool {pool}")
        t0 = time.monotonic()
        jid = self.submit(pool, NOOP)
        job = self.wait(lambda js: js[jid]["state"] in FINISHED, [jid])[jid]
        out = self.executor.logs(job["external_id"], spec_of(job)) if job["external_id"] else ""
        landed = job["pool"] == pool and f"in pool {pool}" in out
        return Check.judge("no-op job runs in its named pool", job["state"] == SUCCEEDED and landed,
                           {"job": jid, "pool": job["pool"], "state": job["state"], "seconds": round(time.monotonic() - t0, 2)},
                           f"finishes with exit 0 in pool {pool}, its output naming the pool",
                           "see `agentrl job show JOB` and `agentrl job logs JOB`",
                           detail=f"state={job['state']} reason={job['reason']!r} output={out.strip()[:300]!r}")

    def preemption(self) -> Check:
        name = "higher tier preempts a lower tier's job"
        why_not = self.executor.preemption()
        if why_not:
            return Check.skipped(name, why_not)
        low = min((p for p in self.cp.pools if p.preemptible), key=lambda p: p.priority, default=None)
        high = max((p for p in self.cp.pools if low and p.priority > low.priority), key=lambda p: p.priority, default=None)
        if low is None or high is None:
            return Check.skipped(name, "no preemptible pool has a pool of a higher tier above it in controlplane.pools",
                                 hint="set preemptible: true on a low-tier pool and a higher priority on another")
        self.progress(f"filling pool {low.name}, then a job in pool {high.name}")
        fill = [self.submit(low.name, SLEEPER) for _ in range(min(low.quota, low.capacity))]
        try:
            running = self.wait(lambda js: all(j["state"] == RUNNING for j in js.values()), fill)
            if not all(j["state"] == RUNNING for j in running.values()):
                return Check(name, CheckStatus.FAIL, {j: v["state"] for j, v in running.items()}, f"{len(fill)} jobs running in {low.name}",
                             "the low-tier jobs never all ran", "free the pool (agentrl job list) and rerun")
            hi = self.submit(high.name, ["sleep", "1"], cpus=high.capacity)
            jobs = self.wait(lambda js: js[hi]["state"] in (RUNNING, SUCCEEDED) and any(js[f]["restarts"] for f in fill), [hi, *fill])
            requeued = {f: jobs[f]["reason"] for f in fill if jobs[f]["restarts"]}
            measured = {"high_job": jobs[hi]["state"], "requeued": len(requeued), "of": len(fill),
                        "reasons": sorted(set(requeued.values()))}
            if jobs[hi]["state"] in (RUNNING, SUCCEEDED) and not requeued:
                return Check.skipped(name, f"the job in pool {high.name} found free CPUs, so nothing needed preempting",
                                     hint="pools on separate nodes do not compete; fill the nodes to see preemption")
            return Check.judge(name, bool(requeued) and jobs[hi]["state"] in (RUNNING, SUCCEEDED), measured,
                               f"a {high.name} job needing {high.capacity} CPUs runs; a running {low.name} job is requeued",
                               f"pool {low.name} needs PreemptMode=REQUEUE and a lower PriorityTier than {high.name} "
                               "(agentrl controlplane render --executor slurm)",
                               detail=f"high job {hi}: {jobs[hi]['state']} {jobs[hi]['reason']!r}")
        finally:
            self.cancel(list(self.submitted))

    def quota_wait(self) -> Check:
        name = "job over quota waits and says why"
        pool = min(self.cp.pools, key=lambda p: (p.quota - p.capacity, -p.priority))
        self._quota_pool = pool
        fill_n = min(pool.quota, pool.capacity)
        self.progress(f"filling pool {pool.name} with {fill_n} job(s), then one more")
        self._blockers = [self.submit(pool.name, SLEEPER) for _ in range(fill_n)]
        running = self.wait(lambda js: all(j["state"] == RUNNING for j in js.values()), self._blockers)
        if not all(j["state"] == RUNNING for j in running.values()):
            return Check(name, CheckStatus.FAIL, {j: v["state"] for j, v in running.items()}, f"{fill_n} jobs running in {pool.name}",
                         "the jobs filling the pool never all ran", "free the pool (agentrl job list) and rerun")
        over = self.submit(pool.name, SLEEPER)
        job = self.wait(lambda js: js[over]["state"] == PENDING and bool(js[over]["reason"]), [over], 30.0)[over]
        binds = "quota" if pool.quota < pool.capacity else "capacity (quota >= capacity)"
        self.cancel([over])
        return Check.judge(name, job["state"] == PENDING and bool(job["reason"]),
                           {"pool": pool.name, "state": job["state"], "reason": job["reason"], "quota": pool.quota},
                           f"pending with the scheduler's reason while {fill_n} job(s) fill the pool's {binds}",
                           "the executor must report why a job waits (Slurm: squeue's Reason)")

    def priority_order(self) -> Check:
        name = "waiting jobs start in priority order"
        pool = self._quota_pool
        if pool is None or not self._blockers:
            return Check.skipped(name, "the pool could not be filled in the quota check; see above")
        lo_name = min(self.cp.priorities, key=lambda p: p.value).name
        hi_name = max(self.cp.priorities, key=lambda p: p.value).name
        if lo_name == hi_name:
            return Check.skipped(name, "only one priority class is configured (controlplane.priorities)")
        lo = self.submit(pool.name, SLEEPER, lo_name)
        hi = self.submit(pool.name, SLEEPER, hi_name)
        self.wait(lambda js: all(j["state"] == PENDING for j in js.values()), [lo, hi], 30.0)
        self.cancel(self._blockers[:1])
        jobs = self.wait(lambda js: RUNNING in (js[lo]["state"], js[hi]["state"]), [lo, hi])
        ok = jobs[hi]["state"] == RUNNING and jobs[lo]["state"] == PENDING
        return Check.judge(name, ok, {hi_name: jobs[hi]["state"], lo_name: jobs[lo]["state"]},
                           f"when a slot frees, the {hi_name} job submitted last starts and the {lo_name} one still waits",
                           "the executor must pass the priority class value to the scheduler",
                           detail=f"{lo_name}: {jobs[lo]['reason']!r}; {hi_name}: {jobs[hi]['reason']!r}")

