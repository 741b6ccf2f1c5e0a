"""A training run under its supervisor: which components a run has, and what the run does when one
goes down, comes back, joins or leaves.

Components (`components(parts, cfg)`):
- the inference servers the run started (`engines/inference/launcher.py`): restartable, `inference-<i>`; an
  SGLang router in front of them: restartable, `router` (no weights of its own);
- servers the run did not start (`inference.urls`): watched, `inference-<i>`;
- the recording gateway, when the run started one: restartable (`gateway`);
- `reward.service_url` and `sandbox.service_url`: watched (`reward`, `sandbox`);
- any components the caller handed the run (`TrainingRun(components=...)`), e.g. a reward service
  a fault drill started as a process; one with the URL or name of a configured one replaces it.

Down: an inference server in the rollout's rotation leaves it at once, in the run's client and in the
gateway's. Up (after a restart, when a watched one answers again, or when an added one joins): an
inference server gets the run's current weights and is verified by the weight publisher
(`WeightPublisher.bring_up`) and only then joins the rotation again; the `back` / `added` event
carries the `weight_version` it was verified at, the trainer's version and step then. Elastic membership comes from the control file
(`control.py`). Without a trainer (`TrainingRun(trainer=False)`) servers serve their launch weights
and rejoin once healthy.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone

from agentrl_cli.engines.registry import engine_for
from agentrl_cli.runtime.observe import keys
from agentrl_cli.run.supervise.component import (INFERENCE, REWARD, SANDBOX, Component, GatewayComponent,
                                             ProcessComponent, RemoteComponent)
from agentrl_cli.run.supervise.control import CONTROL_DIR, ServerControl
from agentrl_cli.run.supervise.supervisor import Supervisor

log = logging.getLogger(__name__)
ROUTER = "router"
EVENTS_SHOWN = 50  # the latest supervisor events in status.json


def components(parts, cfg, extra: list[Component]) -> list[Component]:
    """The components of a started run (its `parts`, `run/parts.py`; `cfg` its platform config) and
    `extra`, named uniquely."""
    routes = engine_for(cfg).routes  # health and ready paths of the engine's servers
    found: list[Component] = []
    startup = cfg.inference.startup_timeout_s
    workers = [s for s in parts.servers if s.name != ROUTER]
    for i, s in enumerate(workers):
        found.append(ProcessComponent.adopt(s, f"inference-{i}", health_path=routes.health, ready_path=routes.ready,
                                            startup_timeout_s=startup))
    for s in parts.servers:
        if s.name == ROUTER:
            found.append(ProcessComponent.adopt(s, ROUTER, kind=ROUTER, health_path=routes.health, ready_path=routes.health,
                                                startup_timeout_s=startup))
    if not parts.servers:
        found += [RemoteComponent(f"inference-{i}", u, kind=INFERENCE, health_path=routes.health)
                  for i, u in enumerate(parts.client.urls)]
    if parts.gateway is not None:
        found.append(GatewayComponent(parts.gateway))
    if cfg.reward.service_url:
        found.append(RemoteComponent(REWARD, cfg.reward.service_url, kind=REWARD))
    if cfg.sandbox.service_url:
        found.append(RemoteComponent(SANDBOX, cfg.sandbox.service_url, kind=SANDBOX))
    taken = {c.url for c in extra} | {c.name for c in extra}
    return [c for c in found if c.url not in taken and c.name not in taken] + list(extra)


class RunSupervision:
    """The supervisor of one started run (its `parts` and `state`, `run/parts.py`; `cfg` its platform
    config: observe, supervisor, inference, reward and sandbox), with the run's hooks and its control file."""

    def __init__(self, parts, state, cfg, extra: list[Component] | None = None) -> None:
        self.parts, self.state = parts, state
        self.health_path = engine_for(cfg).routes.health
        self.counters = parts.controller.counters
        self.routed = set(parts.client.urls)  # servers the rollout sends requests to when they are up
        self.control = ServerControl(parts.run_dir / CONTROL_DIR, self.join, self.leave, self.status)
        self.supervisor = Supervisor(components(parts, cfg, list(extra or [])), interval_s=cfg.observe.health_interval_s,
                                     max_restarts=cfg.supervisor.max_restarts, backoff_s=cfg.supervisor.backoff_s,
                                     on_down=self.on_down, on_up=self.on_up, counters=self.counters,
                                     restart_deadline_s=cfg.inference.startup_timeout_s, on_tick=self.control.tick)

    async def start(self) -> Supervisor:
        self._servers_gauge()
        return await self.supervisor.start()

    async def stop(self) -> None:
        await self.supervisor.stop()

    # ---- the run's hooks ----------------------------------------------------------------------------

    def _clients(self) -> list:
        clients = [self.parts.client]
        if self.parts.gateway is not None:
            clients.append(self.parts.gateway.gateway.backend.client)
        return clients

    def _servers_gauge(self) -> None:
        self.counters[keys.SUPERVISOR_SERVERS] = len(self.parts.client.urls)

    def on_down(self, c: Component) -> None:
        if c.kind == INFERENCE:
            for client in self._clients():
                client.remove_url(c.url)
            self._servers_gauge()

    async def on_up(self, c: Component) -> dict | None:
        if c.kind != INFERENCE:
            return None

        def join() -> None:
            if c.url in self.routed:
                for client in self._clients():
                    client.add_url(c.url)
            self._servers_gauge()
        publisher = self.parts.publisher
        if publisher is None:  # no trainer: the servers serve their launch weights
            join()
            return {"weight_version": None, "run_version": self.state.version, "step": self.state.step}
        version = await publisher.bring_up(c.url, join)
        return {"weight_version": version, "run_version": self.state.version, "step": self.state.step}

    # ---- elastic membership (the control file) ------------------------------------------------------

    async def join(self, url: str) -> None:
        self.routed.add(url)
        if self.supervisor.find(url) is not None:
            return
        names = set(self.supervisor.watches)
        n = next(i for i in range(len(names) + 1) if f"inference-{i}" not in names)
        log.warning("inference server %s joins the run as inference-%d once healthy and at the run's weights", url, n)
        self.supervisor.add(RemoteComponent(f"inference-{n}", url, kind=INFERENCE,
                                            health_path=self.health_path))

    async def leave(self, url: str) -> None:
        self.routed.discard(url)
        c = self.supervisor.find(url)
        if c is not None:
            await self.supervisor.remove(c.name, "agentrl run servers remove")
        else:  # not supervised (never joined): out of rotation all the same
            for client in self._clients():
                client.remove_url(url)
        self._servers_gauge()

    def status(self) -> dict:
        parts = self.parts
        last = parts.publisher.last if parts.publisher is not None else None
        return {"run_id": parts.run_id, "run_dir": str(parts.run_dir),
                "updated": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "interval_s": self.supervisor.interval_s, "step": self.state.step,
                "weight_version": None if last is None else last.version, "rotation": list(parts.client.urls),
                "components": self.supervisor.status(), "events": self.supervisor.events[-EVENTS_SHOWN:]}
