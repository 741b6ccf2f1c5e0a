"""Start an OpenEnv environment class on loopback with the openenv package's own server
(`create_fastapi_app`, served by uvicorn in a thread of this process on a port the kernel picks),
wait for its `/health` under a deadline and stop it; and wait for any OpenEnv server's health.

Belongs here: loading the `module:Class` names of an environment and its action and observation
classes, the in-process server's life. Not here: talking to the server (the adapter uses the
package's clients), serving agentrl harnesses (`openenv_server.py`).
"""

from __future__ import annotations

import inspect
import socket
import threading
import time
import typing

import httpx

from agentrl_cli.core.errors import ConfigError, NotFoundError
from agentrl_cli.core.plugins import import_target


def wait_healthy(url: str, deadline_s: float, server_thread: threading.Thread | None = None) -> None:
    """Poll `url`/health until it answers 200; ConnectionError naming the URL past the deadline
    (or as soon as `server_thread`, when given, has died)."""
    end = time.monotonic() + deadline_s
    last = "no answer"
    with httpx.Client(timeout=2.0, trust_env=False) as client:
        while True:
            try:
                r = client.get(f"{url}/health")
                if r.status_code == 200:
                    return
                last = f"HTTP {r.status_code}"
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
            if server_thread is not None and not server_thread.is_alive():
                raise ConnectionError(f"the OpenEnv server for {url} stopped before it was healthy ({last})")
            if time.monotonic() >= end:
                raise ConnectionError(f"OpenEnv server {url} not healthy after {deadline_s:g} s ({last})")
            time.sleep(0.05)


def load(what: str, target: str) -> type:
    """The class at `module:Class` (ConfigError naming the option when it is not a path)."""
    if not isinstance(target, str) or ":" not in target:
        raise ConfigError(f"harnesses[openenv].options.{what} must be a `module:Class` path, got {target!r}",
                          f"set options.{what} to e.g. harnesses.adapters.openenv_example:BriefReplyEnvironment")
    return import_target(f"harnesses[openenv].options.{what}", target)


def model_classes(env_cls: type, action: str | None, observation: str | None) -> tuple[type, type]:
    """The action and observation classes of `env_cls`: the options when given, else an MCP
    environment's CallToolAction/CallToolObservation, else the `Environment[Act, Obs, State]`
    parameters or the annotations of its `step`."""
    from openenv.core.env_server.mcp_environment import MCPEnvironment
    from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
    from openenv.core.env_server.types import Action, Observation

    found_action, found_obs = (CallToolAction, CallToolObservation) if issubclass(env_cls, MCPEnvironment) else _declared(env_cls)
    action_cls = load("action", action) if action else found_action
    obs_cls = load("observation", observation) if observation else (found_obs or Observation)
    if action_cls is None:
        raise ConfigError(f"cannot tell the action class of {env_cls.__module__}.{env_cls.__name__}: it declares "
                          "neither Environment[Action, Observation, State] parameters nor an annotated step(action)",
                          "set harnesses[openenv].options.action to its `module:ActionClass`")
    for name, cls, base in (("action", action_cls, Action), ("observation", obs_cls, Observation)):
        if not (inspect.isclass(cls) and issubclass(cls, base)):
            raise ConfigError(f"harnesses[openenv].options.{name}: {cls!r} is not a subclass of openenv's {base.__name__}",
                              f"point options.{name} at the environment's {base.__name__} model")
    return action_cls, obs_cls


def _declared(env_cls: type) -> tuple[type | None, type | None]:
    from openenv.core.env_server.interfaces import Environment

    for klass in env_cls.__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            args = typing.get_args(base)
            if typing.get_origin(base) is Environment and len(args) >= 2 and all(inspect.isclass(a) for a in args[:2]):
                return args[0], args[1]
    try:
        hints = typing.get_type_hints(env_cls.step)
    except Exception:  # noqa: BLE001 - unresolvable annotations just mean "not declared"
        hints = {}
    act, obs = hints.get("action"), hints.get("return")
    return (act if inspect.isclass(act) else None), (obs if inspect.isclass(obs) else None)


class LocalServer:
    """One OpenEnv server on 127.0.0.1 for `env_cls`, in a daemon thread; `url` once started."""

    def __init__(self, env_cls: type, action_cls: type, observation_cls: type, *, max_sessions: int = 8,
                 start_timeout_s: float = 30.0) -> None:
        import uvicorn
        from openenv.core.env_server.http_server import create_fastapi_app

        if not getattr(env_cls, "SUPPORTS_CONCURRENT_SESSIONS", False):
            max_sessions = 1  # the package refuses more for an environment that does not isolate sessions
        app = create_fastapi_app(env_cls, action_cls, observation_cls, max_concurrent_envs=max_sessions,
                                 env_name=env_cls.__name__, mode="simulation")
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                        name=f"openenv-{env_cls.__name__}", daemon=True)
        self._thread.start()
        try:
            wait_healthy(self.url, start_timeout_s, self._thread)
        except ConnectionError:
            self.stop()
            raise

    def stop(self, timeout_s: float = 10.0) -> None:
        """Ask the server to exit and wait for its thread (sessions are closed by the package)."""
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        self._sock.close()


def start(env: str, action: str | None, observation: str | None, *, max_sessions: int = 8,
          start_timeout_s: float = 30.0) -> LocalServer:
    """Start the environment `env` (`module:Class`) on loopback."""
    env_cls = load("env", env)
    from openenv.core.env_server.interfaces import Environment

    if not (inspect.isclass(env_cls) and issubclass(env_cls, Environment)):
        raise NotFoundError(f"harnesses[openenv].options.env: {env!r} is not an openenv Environment subclass",
                            "point options.env at a class deriving from openenv.core.env_server.interfaces.Environment")
    action_cls, obs_cls = model_classes(env_cls, action, observation)
    return LocalServer(env_cls, action_cls, obs_cls, max_sessions=max_sessions, start_timeout_s=start_timeout_s)
