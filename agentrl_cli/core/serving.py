"""Serve an ASGI app with uvicorn in a background thread on a (by default loopback) address, and
wait for its /health with a deadline. Used by tests, stage checks and embedded services; the
`agentrl serve ...` commands run uvicorn in the foreground instead."""

from __future__ import annotations

import ipaddress
import socket
import threading
import time

import httpx
import uvicorn

from agentrl_cli.core.httpclient import http_client


def require_loopback(host: str, what: str, allow_non_loopback: bool = False) -> None:
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name, not an address: refused too
        loopback = False
    if not loopback and not allow_non_loopback:
        raise ValueError(f"{what} host {host!r} is not a loopback address; use '127.0.0.1' or '::1', "
                         "or pass allow_non_loopback=True if exposing it is intended")


class ServerThread:
    """`app` served by uvicorn in a daemon thread; `start()` returns once /health answers 200."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, *, name: str = "service",
                 allow_non_loopback: bool = False, startup_timeout_s: float = 10.0, health_path: str = "/health") -> None:
        require_loopback(host, name, allow_non_loopback)
        self.app, self.host, self.port, self.name = app, host, port, name
        self.startup_timeout_s, self.health_path = startup_timeout_s, health_path
        self._server = self._thread = self._socket = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> "ServerThread":
        self._socket = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the port again while its old connections linger
        self._socket.bind((self.host, self.port))
        self.port = self._socket.getsockname()[1]
        # log_config=None: uvicorn's default config would re-point the process-wide uvicorn loggers at
        # stdout at INFO (a window in which another server thread's access lines corrupt `--json` output)
        config = uvicorn.Config(self.app, log_config=None, log_level="warning", access_log=False, lifespan="off",
                                timeout_graceful_shutdown=2)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]},
                                        name=f"{self.name}-{self.port}", daemon=True)
        self._thread.start()
        self._wait_healthy()
        return self

    def _wait_healthy(self) -> None:
        deadline, last = time.monotonic() + self.startup_timeout_s, "no answer yet"
        with http_client(timeout=0.5) as client:
            while time.monotonic() < deadline:
                if not self._thread.is_alive():
                    raise RuntimeError(f"{self.name} on {self.url} exited during startup (see the log above)")
                try:
                    if client.get(f"{self.url}{self.health_path}").status_code == 200:
                        return
                except httpx.TransportError as exc:
                    last = f"{type(exc).__name__}: {exc}"
                time.sleep(0.02)  # poll interval
        self.stop()
        raise RuntimeError(f"{self.name} on {self.url} not healthy within {self.startup_timeout_s} s ({last})")

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=5)
            if self._thread.is_alive():
                self._server.force_exit = True
                self._thread.join(timeout=2)
        if self._socket is not None:
            self._socket.close()
            self._socket = None
