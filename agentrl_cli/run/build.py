"""Building a run's parts when it starts, and closing them when it ends (`RunParts`, `parts.py`).

In order: the inference servers (in the calling thread: a server gets SIGTERM when the thread that
started it dies) and their client, with the trainer backend (with a trainer) made at the same time
in an executor thread, so the two start-ups overlap (where `setpriv` starts the servers: a Python
`preexec_fn` would deadlock against that thread's imports; `launcher.pdeathsig_safe_beside_threads`;
else the backend after the servers); the task sampler, the
buffer and the trajectory writer; the recording gateway, when a harness needs it (`needs_gateway`:
the `agent` harness, whose agents talk to the model through the OpenAI API), started before the
sandboxes so a sandboxed agent's allowlist holds its port, and admitting as many sessions as the
rollout's limits allow (`RolloutController.agent_allowance`); the harnesses' sandbox pools; the
rollout controller; the weight publisher (with a trainer). A start that fails halfway leaves the
parts it built in `PartsBuilder.parts()`, for `close_parts` to close.

Belongs here: making and closing the parts, and the harness factory the rollout uses. Not here:
restoring a checkpoint (`loop/checkpoints.py`), supervising the parts (`supervise/wiring.py`).
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import logging
import os
from typing import Callable

from agentrl_cli.core.errors import ConfigError
from agentrl_cli.run.parts import RunParts

log = logging.getLogger(__name__)


class PartsBuilder:
    """`await build()` makes every part of a run whose early parts (identity, metrics, watchdog,
    checkpoints, samples) are `base`; `parts()` is the whole RunParts, or what a failed build made."""

    def __init__(self, cfg, base: RunParts, *, trainer: bool, progress: Callable[[str], None]) -> None:
        self.cfg, self.base, self.trainer, self.progress = cfg, base, trainer, progress
        self.built: dict = {}

    def parts(self) -> RunParts:
        return dataclasses.replace(self.base, **self.built)

    async def build(self) -> RunParts:
        from agentrl_cli.runtime.data.writer import open_writer
        from agentrl_cli.runtime.rollout.buffer import TrajectoryBuffer
        from agentrl_cli.runtime.rollout.sampler import TaskSampler
        from harnesses.task_sources import task_set

        cfg, r, b = self.cfg, self.cfg.rollout, self.built
        if cfg.sandbox.service_url and any(sandboxed_agent(h) for h in cfg.harnesses):
            raise ConfigError("an agent harness runs its command in a sandbox that must reach the run's gateway on this "
                              "host's loopback, which the remote sandbox service (sandbox.service_url) cannot",
                              "unset sandbox.service_url for this run, or run the agent as an entry function")
        self.base.run_dir.mkdir(parents=True, exist_ok=True)
        # the trainer is built in a thread of its own while the servers start in this one (where they
        # must: see the module's docstring), so the two start-ups overlap on the host's cores; one after
        # the other where a server's start is not safe beside a working thread (no `setpriv` here)
        from agentrl_cli.engines.inference.launcher import pdeathsig_safe_beside_threads

        environ = dict(os.environ)  # the servers' environment: not the trainer's rendezvous variables, set meanwhile
        overlap = self.trainer and pdeathsig_safe_beside_threads()
        backend = self._start_backend() if overlap else None
        try:
            urls = self._servers(environ)
        except BaseException:
            if backend is not None:  # the servers' error is the one raised; a built trainer is closed with the parts
                [made] = await asyncio.gather(backend, return_exceptions=True)
                if not isinstance(made, BaseException):
                    b["backend"] = made
            raise
        if backend is not None:
            b["backend"] = await backend
        elif self.trainer:
            b["backend"] = await self._start_backend()
        train = [h for h in cfg.harnesses if not h.held_out]
        b["sampler"] = TaskSampler({h.name: task_set(h, cfg.data).select("train") for h in train},
                                   {h.name: h.weight for h in train}, group_size=r.group_size, seed=r.seed,
                                   curriculum=r.curriculum)
        b["buffer"] = buffer = TrajectoryBuffer.from_config(cfg)
        if buffer.limit.binds == "rollout.max_buffer_mb":
            self.progress(f"rollout holds at most {buffer.capacity} episodes (in flight + buffered): {buffer.limit.formula()}")
        b["writer"] = open_writer(cfg.data)
        await self._rollout(urls)
        if self.trainer:
            self._publisher()
        return self.parts()

    def _servers(self, environ: dict | None = None) -> list[str]:
        from agentrl_cli.engines.inference.client import client_from_config
        from agentrl_cli.engines.inference.launcher import launch, router_url

        kept = self.base.kept.take(*self._routes()) if self.base.kept is not None else None
        if kept is not None:
            self.progress("using the inference servers the previous run kept")
            servers, urls = kept
        else:
            self.progress("starting inference servers")
            servers, urls = launch(self.cfg, str(self.base.model_path), self.base.run_dir / "logs", beside_trainer=True,
                                   environ=environ)
        self.built["servers"] = tuple(servers)
        self.built["client"] = client = client_from_config(self.cfg, urls, router_url(self.cfg, servers))
        client.watchdog = self.base.watchdog.start()
        return urls

    def _routes(self) -> tuple[str, str]:
        """(the servers' ready route, the router's health route) of the configured engine."""
        from agentrl_cli.engines.registry import engine_for

        routes = engine_for(self.cfg).routes
        return routes.ready, routes.health

    def _start_backend(self) -> asyncio.Future:
        """The trainer backend being made in the loop's executor (started now, not when awaited)."""
        from agentrl_cli.learner.backends import make_backend

        self.progress(f"starting the trainer ({self.cfg.training.backend})")
        make = functools.partial(contextvars.copy_context().run, make_backend, self.base.model_path, self.cfg, self.base.run_dir)
        return asyncio.get_running_loop().run_in_executor(None, make)

    async def _rollout(self, urls: list[str]) -> None:
        from transformers import AutoTokenizer

        from agentrl_cli.envs.sandbox.provider import HarnessSandboxes
        from agentrl_cli.runtime.reward.client import reward_client
        from agentrl_cli.runtime.rollout.controller import RolloutController

        cfg, b, base = self.cfg, self.built, self.base
        sandbox_cfg = cfg
        if any(harness_attr(h.name, "needs_gateway") for h in cfg.harnesses):
            self.progress("starting the recording gateway for agent harnesses")
            b["gateway"] = await asyncio.to_thread(self._gateway, urls)
            sandbox_cfg = b["gateway"].sandbox_config(cfg, sandboxed_agent)
        b["sandboxes"] = HarnessSandboxes(sandbox_cfg)  # warm pools with each harness's limits, or the sandbox service
        controller = RolloutController(cfg, b["client"], AutoTokenizer.from_pretrained(base.model_path),
                                       reward_client(cfg), b["sampler"], b["buffer"], run_id=base.run_id,
                                       writer=b["writer"], phase=base.phase, temperature=cfg.inference.temperature,
                                       make_harness=self._make_harness)
        controller.gateway, controller.watchdog = b.get("gateway"), base.watchdog
        b["controller"] = controller

    def _publisher(self) -> None:
        from agentrl_cli.weightsync.publisher import WeightPublisher
        from agentrl_cli.weightsync.registry import make_transport

        b, base = self.built, self.base
        b["publisher"] = publisher = WeightPublisher(
            make_transport(self.cfg, b["client"], base.run_dir), b["client"], launch_path=base.model_path,
            counters=b["controller"].counters, watchdog=base.watchdog, resume_deadline_s=self.cfg.rollout.resume_deadline_s)
        b["controller"].on_recovered = publisher.resync_servers

    def _gateway(self, urls: list[str]):
        from agentrl_cli.runtime.rollout.agent_gateway import AgentGateway

        def limit() -> int | None:  # read from the gateway's thread: None until the rollout exists
            controller = self.built.get("controller")
            return None if controller is None else controller.agent_allowance()
        return AgentGateway.start(self.cfg, urls, self.base.model_path, limit=limit, watchdog=self.base.watchdog,
                                  router=self.built["client"].router)

    def _make_harness(self, name: str):
        """A harness for the rollout: one acting through sandboxes gets its harness's warm pool; one
        that needs the gateway gets it (and, running its agent as a command, its sandbox pool)."""
        from harnesses.registry import create, uses_sandboxes

        sandboxes, extra = self.built["sandboxes"], {}
        if harness_attr(name, "needs_gateway"):
            extra["gateway"] = self.built.get("gateway")
            hc = next((h for h in self.cfg.harnesses if h.name == name), None)
            if hc is not None and (sandboxed_agent(hc) or (hc.options or {}).get("sandbox") is True):
                extra["sandbox_provider"] = sandboxes.for_harness(name)  # a command's, or a sandboxed entry's tools
        return create(name, self.cfg, sandboxes=sandboxes.for_harness(name) if uses_sandboxes(name) else None, **extra)


async def close_parts(parts: RunParts) -> dict:
    """Close what `parts` holds (the rollout first, the servers last); returns what outlived the
    run's sandbox pools (empty without them). The metrics log and the watchdog are the run's to close."""
    leaks: dict = {}
    if parts.controller is not None:
        parts.controller.close()
    if parts.gateway is not None:
        await asyncio.to_thread(parts.gateway.close_server)
    if parts.sandboxes is not None:
        leaks = parts.sandboxes.close()
        if any(leaks.values()):
            log.error("sandboxes outlived the run: %s", leaks)
    if parts.writer is not None:
        try:
            parts.writer.close()
        except Exception:  # noqa: BLE001 - the run's own error matters more
            log.exception("flushing trajectories failed")
    if parts.publisher is not None:
        try:
            await parts.publisher.close()  # a distributed transport leaves its group on the servers and here
        except Exception:  # noqa: BLE001 - the run's own error matters more
            log.exception("closing the weight transport failed")
    if parts.client is not None:
        await parts.client.close()
    if parts.backend is not None:
        parts.backend.close()
    if parts.kept is not None and parts.servers:  # the next run takes them (`kept_servers.py`)
        parts.kept.hand_over(parts.servers)
    else:
        for s in parts.servers:
            s.stop()
    return leaks


def harness_attr(name: str, attr: str) -> bool:
    """A class attribute of a configured harness (`needs_gateway`), False when it is not set."""
    from harnesses.registry import resolve

    return bool(getattr(resolve(name), attr, False))


def sandboxed_agent(harness_config) -> bool:
    """Whether a harness that needs the gateway runs its agent as a command in a sandbox."""
    return harness_attr(harness_config.name, "needs_gateway") and bool((harness_config.options or {}).get("command"))
