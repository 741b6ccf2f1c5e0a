"""Stage 3 - control plane.

Checks, against the configured state store and executor: the store is reachable, migrated and takes a
fenced write; two real control-plane instances (`agentrl controlplane serve` processes) elect exactly
one leader, the follower takes over within the lease after the leader is killed, and a write carrying
the deposed leader's token is refused; the Kubernetes and Kueue manifests for the configured pools
validate offline; a no-op job submitted to a named pool runs there and finishes; a job of a higher
tier preempts (requeues) a lower tier's running job where the executor preempts (skip with the reason
where it does not); a job over its pool's quota waits and says why; a waiting high-priority job starts
before a waiting low-priority one. Every job the stage submits is cancelled at the end.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import yaml

from agentrl_cli.acceptance.context import StageContext
from agentrl_cli.ops.controlplane import jobcheck
from agentrl_cli.ops.controlplane.executor import ExecutorUnavailable
from agentrl_cli.ops.controlplane.executors import executor_from_config
from agentrl_cli.ops.controlplane.lease import LeaderLease, cluster_view
from agentrl_cli.ops.controlplane.manifests import render_all
from agentrl_cli.ops.controlplane.registry import Registry
from agentrl_cli.ops.controlplane.store import FencedOut, StateStore, StoreUnreachable
from agentrl_cli.ops.controlplane.validate import validate_documents
from agentrl_cli.core.errors import AgentrlError
from agentrl_cli.core.report import Check, CheckStatus, StageReport

STARTUP_DEADLINE_S = 90.0  # two CLI processes importing agentrl on a loaded box


def run(ctx: StageContext) -> StageReport:
    cfg = ctx.config
    checks, store = ctx.produce("state store reachable and writable", lambda: _store(ctx))
    if store is None:
        return ctx.report(checks + [Check.skipped("leader election and jobs", "the state store is not reachable; see above")])
    try:
        checks += _election(ctx, store)
        checks.append(ctx.check("Kubernetes and Kueue manifests validate", lambda: _manifests(cfg)))
        checks += _jobs(ctx, store)
    finally:
        store.close()
    return ctx.report(checks, environment={"state_store": store.kind, "executor": cfg.controlplane.executor,
                                           "lease_seconds": cfg.controlplane.lease_seconds})


def _store(ctx: StageContext) -> tuple[Check, StateStore | None]:
    """The store, opened, and its check (a fenced write read back); None when it does not open."""
    name = "state store reachable and writable"
    url = ctx.config.controlplane.state_store
    t0 = time.perf_counter()
    try:
        store = StateStore(url)
    except (StoreUnreachable, AgentrlError) as exc:
        return Check(name, CheckStatus.FAIL, None, "the store opens and takes a fenced write", exc.message, exc.hint), None

    def write() -> Check:
        lease = LeaderLease(store, f"stage3-{ctx.run.run_id}", 30.0, name=f"stage3-store-{ctx.run.run_id}")
        state = lease.try_acquire()
        registry = Registry(store, lease=lease.name)
        registry.record_run(state.term, ctx.run.run_id, "stage3", ctx.loaded.hash, ctx.loaded.resolved())
        registry.record_result(state.term, ctx.run.run_id, "stage", "3-store-probe", CheckStatus.PASS.value, {"url": store.display_url})
        back = registry.results(ctx.run.run_id)
        lease.release()
        ms = round((time.perf_counter() - t0) * 1000, 1)
        ok = any(r["name"] == "3-store-probe" for r in back)
        return Check.judge(name, ok, {"store": store.display_url, "schema_version": store.schema_version(), "open_and_write_ms": ms},
                           "schema migrated; a fenced write reads back", "check controlplane.state_store and the database's permissions")
    return ctx.check(name, write), store


def _election(ctx: StageContext, store: StateStore) -> list[Check]:
    """Two real instances on a probe lease (so a live production leader is not disturbed)."""
    cp = ctx.config.controlplane
    lease_name = f"stage3-election-{ctx.run.run_id}"
    logs = ctx.run.logs
    logs.mkdir(parents=True, exist_ok=True)
    conf = logs / "controlplane-probe.yaml"  # the instances need only the control-plane section
    conf.write_text(yaml.safe_dump({"controlplane": cp.model_dump(mode="json")}), encoding="utf-8")
    argv = [sys.executable, "-m", "agentrl_cli", "controlplane", "serve", "--config", str(conf.resolve()),
            "--lease-name", lease_name, "--no-dispatch"]
    procs = [subprocess.Popen(argv, stdout=open(logs / f"controlplane-{i}.log", "wb"), stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, start_new_session=True) for i in range(2)]
    try:
        ctx.progress("waiting for two control-plane instances")
        view = _wait_view(store, cp.lease_seconds, lease_name, lambda v: len(v["instances"]) == 2 and v["leader"], STARTUP_DEADLINE_S,
                          procs)
        believers = [i for i in view["instances"] if i["believes_leader"]]
        one = Check.judge("one leader among two instances", len(view["instances"]) == 2 and len(believers) == 1
                          and believers[0]["id"] == view["leader"],
                          {"instances": len(view["instances"]), "leaders": len(believers), "term": view["term"]},
                          "2 instances, exactly 1 believes it leads, and it holds the lease",
                          f"see {logs}/controlplane-*.log; both instances must reach controlplane.state_store")
        if one.status != CheckStatus.PASS:
            return [one, Check.skipped("failover within the lease", "no single leader to kill; see above")]
        leader = next(i for i in view["instances"] if i["id"] == view["leader"])
        victim = next((p for p in procs if p.pid == leader["pid"]), None)
        if victim is None:
            return [one, Check("failover within the lease", CheckStatus.FAIL, leader, "the leader is one of the two started instances",
                               "another process holds the probe lease", "rerun the stage")]
        old_term, t_kill = view["term"], time.monotonic()
        victim.send_signal(signal.SIGKILL)
        bound = cp.lease_seconds * 1.5  # the lease, plus one renew interval (lease/3) for the follower to notice, plus slack
        ctx.progress("killed the leader; waiting for the follower to take over")
        after = _wait_view(store, cp.lease_seconds, lease_name, lambda v: v["leader"] and v["leader"] != leader["id"],
                           cp.lease_seconds * 4, [p for p in procs if p is not victim])
        failover_s = round(time.monotonic() - t_kill, 3)
        took_over = bool(after["leader"]) and after["leader"] != leader["id"]
        failover = Check.judge("failover within the lease", took_over and failover_s <= bound,
                               {"failover_s": failover_s, "lease_s": cp.lease_seconds, "new_term": after["term"]},
                               f"the follower leads within {bound:.1f} s (lease + one renew interval) of the leader's death",
                               "the follower renews every lease/3 s; check its log and the store's latency",
                               detail=f"leader {leader['id']} killed; new leader {after['leader'] or 'none'}")
        try:
            with store.fenced(old_term, lease_name) as tx:
                tx.execute("UPDATE instances SET last_seen = last_seen WHERE id = ?", (leader["id"],))
            refused, detail = False, "the store accepted a write with the old token"
        except FencedOut as exc:
            refused, detail = True, exc.message
        fenced = Check.judge("deposed leader's write refused", refused, {"old_token": old_term, "current_term": after["term"]},
                             "a write with the old fencing token is refused", "every registry write must go through store.fenced",
                             detail=detail)
        return [one, failover, fenced]
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def _wait_view(store: StateStore, lease_s: float, name: str, ok, deadline_s: float, procs) -> dict:
    deadline = time.monotonic() + deadline_s
    while True:
        view = cluster_view(store, lease_s, name)
        if ok(view) or time.monotonic() >= deadline or all(p.poll() is not None for p in procs):
            return view
        time.sleep(0.05)


def _manifests(cfg) -> Check:
    docs = render_all(cfg)
    errors = validate_documents(docs)
    kinds = sorted({d["kind"] for d in docs})
    return Check.judge("Kubernetes and Kueue manifests validate", not errors, {"objects": len(docs), "kinds": kinds, "errors": len(errors)},
                       "every rendered object validates against its Kubernetes / Kueue v1beta2 / JobSet schema",
                       "fix the config values named in the errors (controlplane.pools, cluster.*)", detail="\n".join(errors[:20]))


def _jobs(ctx: StageContext, store: StateStore) -> list[Check]:
    cfg = ctx.config
    names = ["no-op job runs in its named pool", "higher tier preempts a lower tier's job", "job over quota waits and says why",
             "waiting jobs start in priority order"]
    try:
        executor = executor_from_config(cfg)
        executor.check()
    except ExecutorUnavailable as exc:
        if cfg.controlplane.executor == "kubernetes":
            return [Check.skipped(n, exc.message, hint=exc.hint) for n in names]
        return [Check("executor available", CheckStatus.FAIL, cfg.controlplane.executor, "the configured executor can submit jobs",
                      exc.message, exc.hint)]
    except AgentrlError as exc:
        return [Check("executor available", CheckStatus.FAIL, cfg.controlplane.executor, "the configured executor can submit jobs",
                      exc.message, exc.hint)]
    except Exception as exc:  # noqa: BLE001 - a scheduler that errors in an unexpected way is a failing check, not a crash
        return [Check.crashed("executor available", exc)]
    probe = jobcheck.JobProbe(cfg, store, executor, progress=ctx.progress)
    try:
        return [ctx.check(names[0], probe.noop), ctx.check(names[1], probe.preemption),
                ctx.check(names[2], probe.quota_wait), ctx.check(names[3], probe.priority_order)]
    finally:
        probe.cleanup()
