"""Injecting a chaos run's faults and reading, from the run itself, when each was seen and how it
was recovered.

The injector rides on the run: `attach(run)` at the start of every attempt (a trainer restart makes
a new one), `on_step(row)` at every step boundary (where the faults due are injected, as
`schedule.py` orders them), `crashed(run, exc)` when an attempt ends in a trainer crash, and
`watch()`, a task that reads the evidence every POLL_S:

- server, sandbox: the run's supervisor's events for the component (`down`, then `back`);
- rank: the crash (`crashed`, its cause as `run/loop/restarts.py` names it), then the first step of the
  attempt that resumed from the latest checkpoint;
- reward: the reward client's outages (its first failed call, its first answer after);
- store: the S3 store's outages (its first failed put, the spool uploaded again).

Times are seconds since the injector was made (the faulted run's start). A supervisor event is
stamped when the watcher first sees it (at most POLL_S late); the others carry their own clocks.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from dataclasses import dataclass, field

from agentrl_cli.acceptance.chaos.schedule import DESCRIPTIONS, OUTAGE_S, PlannedFault, bounds

log = logging.getLogger(__name__)
POLL_S = 0.1


@dataclass
class FaultRecord:
    kind: str
    planned_step: int
    t0: float  # the injector's start (time.monotonic()): every time below is seconds after it
    target: str = ""
    detect_bound_s: float = 0.0
    recover_bound_s: float = 0.0
    injected_step: int | None = None
    injected_at: float | None = None
    detected_at: float | None = None
    recovered_at: float | None = None
    detected_by: str = ""
    how: str = ""
    failed: str = ""  # why it counts as not recovered (a component given up on)
    evidence: dict = field(default_factory=dict)

    @property
    def done(self) -> bool:
        """Recovered, failed, or past its recovery bound: the next fault may come."""
        return (self.recovered_at is not None or bool(self.failed)
                or (self.injected_at is not None and time.monotonic() - self.t0 > self.injected_at + self.recover_bound_s))

    def row(self) -> dict:
        detect = None if self.detected_at is None else round(self.detected_at - self.injected_at, 3)
        recover = None if self.recovered_at is None else round(self.recovered_at - self.injected_at, 3)
        problems = []
        if self.injected_at is None:
            problems.append("not injected: the run reached its last step first")
        else:
            if detect is None:
                problems.append("never seen")
            elif detect > self.detect_bound_s:
                problems.append(f"seen after {detect:g} s, past its bound of {self.detect_bound_s:g} s")
            if recover is None:
                problems.append(self.failed or "never recovered")
            elif recover > self.recover_bound_s:
                problems.append(f"recovered after {recover:g} s, past its bound of {self.recover_bound_s:g} s")
        return {"kind": self.kind, "fault": DESCRIPTIONS[self.kind], "target": self.target,
                "planned_step": self.planned_step, "injected_step": self.injected_step,
                "injected_at_s": _r(self.injected_at), "detected_at_s": _r(self.detected_at),
                "recovered_at_s": _r(self.recovered_at), "detect_s": detect, "recover_s": recover,
                "detect_bound_s": round(self.detect_bound_s, 3), "recover_bound_s": round(self.recover_bound_s, 3),
                "detected_by": self.detected_by, "how": self.how, "evidence": self.evidence,
                "status": "fail" if problems else "pass", "detail": "; ".join(problems)}


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


class Injector:
    def __init__(self, plan: list[PlannedFault], cfg, services, steps: int) -> None:
        self.cfg, self.services, self.steps = cfg, services, steps
        self.t0 = time.monotonic()
        self.faults = []
        for p in plan:
            detect, recover = bounds(p.kind, cfg)
            record = FaultRecord(p.kind, p.after_step, self.t0, detect_bound_s=detect, recover_bound_s=recover)
            record.evidence["target_index"] = p.target
            self.faults.append(record)
        self.run = None
        self.attempts: list = []
        self._seen: dict[int, int] = {}  # id(supervisor) -> events already read

    def now(self) -> float:
        return time.monotonic() - self.t0

    def _rel(self, monotonic: float) -> float:
        return monotonic - self.t0

    # ---- the run's hooks ----------------------------------------------------------------------------

    def attach(self, run) -> None:
        """A new attempt of the run (the first, or one resumed after a trainer crash)."""
        self.run = run
        self.attempts.append(run)

    def crashed(self, run, exc: BaseException) -> None:
        from agentrl_cli.run.loop.restarts import crash_cause, describe

        rank = self._fault("rank")
        if rank is not None and rank.injected_at is not None and rank.detected_at is None:
            rank.detected_at = self.now()
            cause = crash_cause(exc)
            rank.detected_by = f"the trainer's next call failed ({cause or 'not a trainer crash'})"
            rank.evidence.update(crash=describe(exc)[:300], cause=cause, last_step=run.step)
            if cause is None:
                rank.failed = "the crash was not recognised as a trainer crash, so the run did not restart"

    def on_step(self, row: dict) -> None:
        run = self.run
        rank = self._fault("rank")
        if rank is not None and rank.detected_at is not None and rank.recovered_at is None and run.restarts:
            rank.recovered_at = self.now()
            rank.how = (f"the run restarted (restart {run.restarts} of training.max_restarts="
                        f"{self.cfg.training.max_restarts}) with new ranks and resumed from "
                        f"{run.resumed_from or 'the start'}; step {run.step} trained")
            rank.evidence.update(resumed_from=run.resumed_from, first_step_after=run.step)
        if rank is not None and rank.injected_at is not None and not rank.done:
            return  # the run restarts: nothing else until it trains again
        for fault in self.faults:
            if fault.injected_at is not None:
                continue
            if not fault.planned_step <= run.step < self.steps:  # never at the last boundary: nothing would see it
                break
            if fault.kind == "rank":
                if not all(f.done for f in self.faults if f.injected_at is not None):
                    break  # it waits for any fault before it, and the later ones wait for it
                self._inject(fault, run)
                break
            self._inject(fault, run)

    # ---- injecting ----------------------------------------------------------------------------------

    def _inject(self, fault: FaultRecord, run) -> None:
        index = fault.evidence.pop("target_index", 0)
        fault.injected_step = run.step
        fault.injected_at = self.now()  # before the fault: a client thread may fail on it at once
        if fault.kind == "server":
            workers = [s for s in run.servers if s.name != "router"]
            server = workers[index % len(workers)]
            fault.target = f"inference-{workers.index(server)} ({server.url}, pid {server.proc.pid})"
            fault.evidence["component"] = f"inference-{workers.index(server)}"
            _kill(server.proc.pid)
        elif fault.kind == "rank":
            pids = list(run.backend.pids)
            pid = pids[index % len(pids)]
            fault.target = f"trainer rank {pids.index(pid)} of {len(pids)} (pid {pid})"
            _kill(pid)
        elif fault.kind == "sandbox":
            server = self.services.sandbox.server
            fault.target = f"sandbox service ({server.url}, pid {server.proc.pid})"
            fault.evidence["component"] = self.services.sandbox.name
            _kill(server.proc.pid)
        else:
            gate = self.services.reward_gate if fault.kind == "reward" else self.services.s3_gate
            fault.target = f"{'reward service' if fault.kind == 'reward' else 'S3 endpoint'} at {gate.url}"
            gate.close_for(OUTAGE_S, lambda: fault.evidence.update(reopened_at_s=round(self.now(), 3)))
        log.warning("chaos: injected %s at step %d: %s", fault.kind, run.step, fault.target)

    def reopen_all(self) -> None:
        """Open every gate a fault closed (at the end, whatever happened)."""
        for gate in (self.services.reward_gate, self.services.s3_gate):
            if gate is not None and not gate.is_open:
                gate.open()

    # ---- reading the evidence -----------------------------------------------------------------------

    async def watch(self) -> None:
        while True:
            try:
                self._read()
            except Exception:  # noqa: BLE001 - a watcher's bug must not end the run it watches
                log.exception("chaos: reading the evidence failed")
            await asyncio.sleep(POLL_S)

    def _read(self) -> None:
        events = self._new_events()
        for fault in self.faults:
            if fault.injected_at is None or fault.recovered_at is not None or fault.failed:
                continue
            if fault.kind in ("server", "sandbox"):
                self._from_supervisor(fault, events)
            elif fault.kind == "reward" and self.run is not None:
                self._from_outages(fault, getattr(self.run.controller.reward, "outages", []), "reward")
            elif fault.kind == "store" and self.run is not None and self.run.writer is not None:
                self._from_outages(fault, getattr(self.run.writer.store, "outages", []), "store")

    def _new_events(self) -> list[dict]:
        """Supervisor events not read before, each stamped now."""
        out = []
        for run in self.attempts:
            sup = getattr(run, "supervisor", None)
            if sup is None:
                continue
            start = self._seen.get(id(sup), 0)
            fresh = sup.events[start:]
            self._seen[id(sup)] = start + len(fresh)
            out += [{**e, "seen_at": self.now()} for e in fresh]
        return out

    def _from_supervisor(self, fault: FaultRecord, events: list[dict]) -> None:
        name = fault.evidence.get("component")
        for e in (e for e in events if e["component"] == name):
            fault.evidence.setdefault("events", []).append({k: e.get(k) for k in ("event", "t", "seconds", "cause",
                                                                                  "weight_version", "run_version")})
            if e["event"] == "down" and fault.detected_at is None:
                fault.detected_at = e["seen_at"]
                fault.detected_by = f"the run's supervisor: {name} down ({e['cause']})"
            elif e["event"] == "back" and fault.detected_at is not None:
                fault.recovered_at = e["seen_at"]
                version = f" at weight version {e['weight_version']}" if e.get("weight_version") is not None else ""
                fault.how = (f"restarted by the run's supervisor, healthy again{version} and back in rotation "
                             f"after {e['seconds']} s out")
            elif e["event"] == "gave_up":
                fault.failed = f"the supervisor gave up on {name}: {e['cause']}"

    def _from_outages(self, fault: FaultRecord, outages: list[dict], what: str) -> None:
        since = self.t0 + fault.injected_at
        outage = next((o for o in outages if o["start"] >= since), None)
        if outage is None:
            return
        fault.evidence["failures"] = outage["failures"]
        if fault.detected_at is None:
            fault.detected_at = self._rel(outage["start"])
            fault.detected_by = ("the reward client: a call failed (connection refused)" if what == "reward"
                                 else "the S3 store: a put failed and its file was spooled")
        end = outage["end"] if what == "reward" else outage.get("drained")
        if end is not None:
            fault.recovered_at = self._rel(end)
            fault.how = (f"the reward client retried ({outage['failures']} failed attempts) until the service answered"
                         if what == "reward" else
                         f"the store spooled what it could not put ({outage['failures']} failed puts) and uploaded "
                         "the spool once S3 answered")

    # ---- after the last step ------------------------------------------------------------------------

    async def settle(self) -> None:
        """Wait, within their bounds, for the injected faults to recover (the run is still up)."""
        while not all(f.done for f in self.faults if f.injected_at is not None):
            self._read()
            await asyncio.sleep(POLL_S)
        self._read()

    def _fault(self, kind: str) -> FaultRecord | None:
        return next((f for f in self.faults if f.kind == kind), None)

    def rows(self) -> list[dict]:
        return [f.row() for f in self.faults]


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
