"""The parts of a run the supervisor watches (`supervisor.py`), each with a name, the URL its health
is polled at, and whether the run may restart it.

- `ProcessComponent(name, cmd, url, logs, env)`: a child process started from a command (`start()`),
  restarted by starting the same command on the same port and waiting for health with a deadline;
  `ProcessComponent.adopt(server)` wraps an inference server `engines/inference/launcher.py` started.
- `RemoteComponent(name, url)`: a service the run did not start (`inference.urls`,
  `reward.service_url`, `sandbox.service_url`, a server added with `agentrl run servers add`): never
  restarted, only taken out of and put back into rotation by its health.
- `GatewayComponent(gateway)`: the run's recording gateway (`runtime/rollout/agent_gateway.py`), served by
  uvicorn in a thread of this process; restarted by serving the same app again on the same port.

`kind` says what the run does around a restart: an `inference` component leaves the client's
rotation while down and is brought to the run's weights before it joins again; the others are
watched and restarted only.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from agentrl_cli.engines.inference.launcher import ServerProcess, relaunch, start_process, wait_healthy

INFERENCE, REWARD, SANDBOX, GATEWAY, SERVICE = "inference", "reward", "sandbox", "gateway", "service"
LOG_TAIL_CHARS = 2000


class Component:
    """What the supervisor needs of a part of the run. Subclasses that can restart set `restartable`."""

    restartable = False

    def __init__(self, name: str, url: str, *, kind: str = SERVICE, health_path: str = "/health") -> None:
        self.name, self.url, self.kind, self.health_path = name, url.rstrip("/"), kind, health_path

    def start(self) -> None:
        """Start it if the run is to start it (nothing for a component already running)."""

    def started(self) -> bool:
        """Whether it was started (a component the supervisor is to start first is not)."""
        return True

    def exit_code(self) -> int | None:
        """The exit status of its process once that ended; None while it runs (or has none here)."""
        return None

    async def restart(self, deadline_s: float) -> None:
        """Start it again and return once it is healthy; raise when it is not within `deadline_s`."""
        raise NotImplementedError(f"{self.name} is not restartable")

    def log_tail(self) -> str:
        """Its last log lines (empty when the run has no log of it)."""
        return ""

    def stop(self) -> None:
        """Stop what the run started of it (nothing for a remote one)."""

    def describe(self) -> dict:
        return {"component": self.name, "url": self.url, "kind": self.kind, "restartable": self.restartable}


class RemoteComponent(Component):
    """A service the run did not start: watched by health alone."""


class ProcessComponent(Component):
    """A child process from a command. `ready_path` is polled after a (re)start until it answers 200."""

    restartable = True

    def __init__(self, name: str, cmd: list[str], url: str, logs: Path, env: dict | None = None, *,
                 kind: str = SERVICE, health_path: str = "/health", ready_path: str | None = None,
                 startup_timeout_s: float = 60.0) -> None:
        super().__init__(name, url, kind=kind, health_path=health_path)
        self.cmd, self.logs, self.env = list(cmd), Path(logs), env
        self.ready_path = ready_path or health_path
        self.startup_timeout_s = startup_timeout_s
        self.server: ServerProcess | None = None

    @classmethod
    def adopt(cls, server: ServerProcess, name: str, *, kind: str = INFERENCE, health_path: str = "/health",
              ready_path: str = "/health_generate", startup_timeout_s: float = 300.0) -> "ProcessComponent":
        """A component over a server already started (`launcher.launch`): restarts reuse its command,
        environment and start-up hooks, and replace its process in place. The paths are its engine's
        (`InferenceEngine.routes`: health, ready)."""
        c = cls(name, server.cmd, server.url, server.log_path.parent, server.env, kind=kind, health_path=health_path,
                ready_path=ready_path, startup_timeout_s=startup_timeout_s)
        c.server = server
        return c

    def start(self, wait_s: float | None = None) -> None:
        """Start the command unless it runs; with `wait_s`, wait until it is healthy (raises when it
        exits or is not healthy by then). Call it from a thread that lives as long as the process
        should (the child gets SIGTERM when that thread ends)."""
        if self.server is None:
            self.server = start_process(self.name, self.cmd, self.url, self.logs, self.env)
        elif not self.server.alive():
            relaunch(self.server)
        if wait_s is not None:
            wait_healthy([self.server], wait_s, self.ready_path)

    def started(self) -> bool:
        return self.server is not None

    def exit_code(self) -> int | None:
        return None if self.server is None else self.server.proc.poll()

    async def restart(self, deadline_s: float) -> None:
        if self.server is not None and self.server.alive():
            await asyncio.to_thread(self.server.stop, 5.0)  # hung: terminate, then kill
        if self.server is None:
            self.server = start_process(self.name, self.cmd, self.url, self.logs, self.env)
        else:
            relaunch(self.server)  # on the event loop's thread: the process lives as long as the run's loop
        await asyncio.to_thread(wait_healthy, [self.server], min(deadline_s, self.startup_timeout_s), self.ready_path)
        if self.server.after_healthy is not None:
            self.server.after_healthy()

    def log_tail(self) -> str:
        return "" if self.server is None else self.server.log_tail(LOG_TAIL_CHARS)

    @property
    def log_path(self) -> Path:
        return self.logs / f"{self.name}.log" if self.server is None else self.server.log_path

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()


class GatewayComponent(Component):
    """The run's recording gateway (an `AgentGateway`): restarted by serving its app again on its port."""

    restartable = True

    def __init__(self, gateway, name: str = "gateway") -> None:
        super().__init__(name, gateway.url, kind=GATEWAY)
        self.gateway = gateway

    def exit_code(self) -> int | None:
        thread = getattr(self.gateway.server, "_thread", None)
        return 1 if thread is not None and not thread.is_alive() else None

    async def restart(self, deadline_s: float) -> None:
        from agentrl_cli.core.serving import ServerThread

        old = self.gateway.server
        await asyncio.to_thread(old.stop)
        end = time.monotonic() + deadline_s
        while True:
            try:
                self.gateway.server = await asyncio.to_thread(
                    ServerThread(old.app, old.host, old.port, name=old.name,
                                 startup_timeout_s=max(1.0, end - time.monotonic())).start)
                return
            except OSError:  # the port is not free yet
                if time.monotonic() > end:
                    raise
                await asyncio.sleep(0.2)
