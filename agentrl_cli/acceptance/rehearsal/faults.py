"""`agentrl rehearse --chaos`: node faults while the run trains across the nodes, one after another,
each held for a while and then undone as a cluster would undo it, and each judged by whether the
deployment recovered within its bound:

- link cut: inference-1's link goes down for `hold_s` (`ip link set eth0 down` in its namespace), then
  up. Recovered: it answers again, serves the run's newest weight version, and training moved on.
- replica kill: every process of the sandbox replica on sandbox-1 is SIGKILLed, and the replica is
  started again after `hold_s` (as its StatefulSet would). Recovered: the load balancer hands it
  sandboxes again (its own counter above zero) and training moved on.
- node kill: every process of inference-0 is SIGKILLed (a node that died), and its server is started
  again after `hold_s` (the node back). Recovered: as for the link cut.

Each fault waits until training has moved `progress_steps` steps since the last one, so every fault
lands while the run trains. What the run lost is judged afterwards by the ledger (`rehearsal.py`):
every trained trajectory in the store, none twice.

Belongs here: the faults, their order and their recovery conditions. Does not: the nodes (`ops/rehearse/nodes.py`),
starting services (`ops/rehearse/services.py`), the rest of the rehearsal (`rehearsal.py`).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from agentrl_cli.ops.rehearse.host import ip, kill_and_wait, pids_in


@dataclass
class Fault:
    kind: str
    node: str
    injected: bool = False
    step_at_injection: int | None = None
    injected_at_s: float | None = None  # since the rehearsal's workload began
    undone_at_s: float | None = None
    recovered_at_s: float | None = None
    recovery_s: float | None = None  # from undoing the fault to recovered
    bound_s: float = 0.0
    recovered: bool = False
    detail: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Chaos:
    """The faults of one rehearsal, run on a thread of their own while the workload runs (`start`,
    `join`). `rehearsal` gives the nodes, the services and `ask` (a probe from a node)."""

    rehearsal: object
    metrics: Path  # the run's metrics.jsonl: its last step says whether training moves
    hold_s: float = 10.0
    bound_s: float = 180.0
    progress_steps: int = 3
    faults: list[Fault] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _t0: float = 0.0

    def start(self) -> None:
        self._t0 = time.monotonic()
        self.faults = [Fault("link cut", "inference-1", bound_s=self.bound_s),
                       Fault("replica kill", "sandbox-1", bound_s=self.bound_s),
                       Fault("node kill", "inference-0", bound_s=self.bound_s)]
        self._thread = threading.Thread(target=self._run, name="rehearse-chaos", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Called once the workload ended: a fault still waiting is recorded as never injected."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.bound_s + 60)

    def _now(self) -> float:
        return round(time.monotonic() - self._t0, 1)

    def step(self) -> int:
        """The run's last trained step (0 before the first)."""
        try:
            lines = self.metrics.read_text(encoding="utf-8").strip().splitlines()
            return int(json.loads(lines[-1])["step"]) if lines else 0
        except (OSError, ValueError, KeyError):
            return 0

    def _wait(self, ok: Callable[[], bool], deadline_s: float) -> bool:
        until = time.monotonic() + deadline_s
        while not self._stop.is_set():
            if ok():
                return True
            if time.monotonic() > until:
                return False
            time.sleep(1.0)
        return ok()

    def _run(self) -> None:
        r = self.rehearsal
        for fault in self.faults:
            start = self.step()
            if not self._wait(lambda s=start: self.step() >= s + self.progress_steps, self.bound_s):
                fault.detail = (f"training did not move {self.progress_steps} steps (at step {self.step()}) before the fault"
                                if not self._stop.is_set() else "the run ended before the fault")
                return
            fault.injected, fault.step_at_injection, fault.injected_at_s = True, self.step(), self._now()
            try:
                getattr(self, "_" + fault.kind.replace(" ", "_"))(fault, r)
            except Exception as exc:  # noqa: BLE001 - a fault that could not be made or undone is this fault's failure
                fault.detail = f"{type(exc).__name__}: {exc}"

    # ---- the faults ------------------------------------------------------------------------------

    def _link_cut(self, fault: Fault, r) -> None:
        node = r.net.nodes[fault.node]
        ip("link", "set", "eth0", "down", netns=node.netns)
        time.sleep(self.hold_s)
        ip("link", "set", "eth0", "up", netns=node.netns)
        fault.undone_at_s = self._now()
        self._recovered(fault, lambda: self._serves_newest(r, fault.node))

    def _replica_kill(self, fault: Fault, r) -> None:
        from agentrl_cli.ops.rehearse import services

        self._kill_and_restart(fault, r, services.sandbox_replica, lambda: (self._acquired(r, fault.node) or 0) > 0)

    def _node_kill(self, fault: Fault, r) -> None:
        from agentrl_cli.ops.rehearse import services

        self._kill_and_restart(fault, r, services.inference_server, lambda: self._serves_newest(r, fault.node))

    def _kill_and_restart(self, fault: Fault, r, start, recovered: Callable[[], bool]) -> None:
        """SIGKILL every process of the fault's node, wait `hold_s`, start its service again with `start`."""
        node = r.net.nodes[fault.node]
        kill_and_wait(pids_in(node.netns))
        time.sleep(self.hold_s)
        r.started[fault.node] = start(node, r.config_path, r.ports, r.opts.out_dir / "logs", r.env)
        fault.undone_at_s = self._now()
        self._recovered(fault, recovered)

    # ---- recovery --------------------------------------------------------------------------------

    def _recovered(self, fault: Fault, ok: Callable[[], bool]) -> None:
        start = self.step()
        moved = lambda: self.step() >= start + self.progress_steps  # noqa: E731
        fault.recovered = self._wait(lambda: ok() and moved(), self.bound_s)
        if fault.recovered:
            fault.recovered_at_s = self._now()
            fault.recovery_s = round(fault.recovered_at_s - fault.undone_at_s, 1)
        else:
            fault.detail = (f"not recovered within {self.bound_s:.0f} s: the service "
                            f"{'answered' if ok() else 'did not answer as expected'}, training at step {self.step()} "
                            f"(was {start})")

    def _serves_newest(self, r, name: str) -> bool:
        """`name` answers and serves the newest weight version the run exported."""
        weights = r.opts.out_dir / "runs" / r.run_id / "stage8" / "weights"
        versions = sorted(int(p.name[1:]) for p in weights.glob("v*") if p.name[1:].isdigit())
        got = r.ask("trainer-0", {"op": "http", "url": f"http://{name}:{r.ports.inference}/get_weight_version", "timeout": 5})
        try:
            serving = int(json.loads(got["text"])["weight_version"])
        except (KeyError, ValueError, TypeError):
            return False
        return not versions or serving >= versions[-1]

    def _acquired(self, r, name: str) -> float | None:
        got = r.ask("trainer-0", {"op": "http", "url": f"http://{name}:{r.ports.sandbox}/metrics", "timeout": 5})
        m = re.search(r"^agentrl_sandbox_pool_acquired (\S+)$", got.get("text", ""), re.M)
        return float(m.group(1)) if m else None
