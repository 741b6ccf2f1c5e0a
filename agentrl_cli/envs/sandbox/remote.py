"""The client side of the sandbox service: `RemoteSandbox` has the methods harnesses use on a local
`Sandbox` (exec, write_file, read_file, close), and `RemoteProvider` hands them out like the pool,
so a harness runs unchanged against local or remote sandboxes."""

from __future__ import annotations

from pathlib import PurePosixPath

import httpx

from agentrl_cli.core.errors import ConfigError
from agentrl_cli.core.httpclient import http_client
from agentrl_cli.envs.sandbox.files import UnsafePath
from agentrl_cli.envs.sandbox.result import ExecResult
from agentrl_cli.envs.sandbox.sandbox import HOST_GRACE_S


class RemoteSandbox:
    def __init__(self, client: httpx.Client, info: dict) -> None:
        self._client = client
        self.id = info["id"]
        self.isolated = bool(info["isolated"])
        self.workdir = PurePosixPath(info["workdir"])
        self._closed = False

    def exec(self, command, timeout: float | None = None, stdin: str | None = None, env: dict | None = None,
             cwd: str | None = None, cpu_time_s: int | None = None) -> ExecResult:
        body = {"command": command, "timeout": timeout, "stdin": stdin, "env": env, "cpu_time_s": cpu_time_s}
        try:
            r = self._client.post(f"/sandboxes/{self.id}/exec", json=body,
                                  timeout=(timeout or 600) + HOST_GRACE_S + 5)
            r.raise_for_status()
        except httpx.HTTPError as exc:
            return ExecResult(exit_code=None, killed_reason="sandbox_lost", error=f"sandbox service: {exc}")
        data = r.json()
        data.pop("status", None)
        return ExecResult(**data)

    def write_file(self, relpath: str, data: bytes | str, mode: int = 0o644) -> None:
        r = self._client.put(f"/sandboxes/{self.id}/files", params={"path": relpath},
                             content=data.encode() if isinstance(data, str) else data)
        if r.status_code == 400:
            raise UnsafePath(r.json().get("detail", "refused"), "use a relative path inside the work directory")
        r.raise_for_status()

    def read_file(self, relpath: str, max_bytes: int = 1 << 20) -> bytes:
        r = self._client.get(f"/sandboxes/{self.id}/files", params={"path": relpath, "max_bytes": max_bytes})
        if r.status_code == 400:
            raise UnsafePath(r.json().get("detail", "refused"), "results must be plain files inside the work directory")
        r.raise_for_status()
        return r.content

    @property
    def alive(self) -> bool:
        return not self._closed

    def processes(self) -> set[int]:
        return set()  # not visible from here; the service's /metrics counts leaks

    def resources(self) -> dict | None:
        """What the sandbox used so far, as the service reads it (`Sandbox.resources`); None when it cannot say."""
        if self._closed:
            return None
        try:
            r = self._client.get(f"/sandboxes/{self.id}/resources")
            r.raise_for_status()
            data = r.json()
        except (httpx.HTTPError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                self._client.delete(f"/sandboxes/{self.id}")
            except httpx.HTTPError:
                pass  # the service reclaims stragglers by lease timeout


class RemoteProvider:
    """acquire/release over the sandbox service at `url`, sending `api_key` (sandbox.api_key's current key)."""

    def __init__(self, url: str, timeout_s: float = 60.0, api_key: str | None = None) -> None:
        self.url = url.rstrip("/")
        self._client = http_client(base_url=self.url, timeout=timeout_s,
                                   headers={"Authorization": f"Bearer {api_key}"} if api_key else None)

    def acquire(self) -> RemoteSandbox:
        r = self._client.post("/sandboxes")
        if r.status_code == 401:
            raise ConfigError(f"the sandbox service {self.url} refused this client's key (401)",
                              "set sandbox.api_key (AGENTRL_SANDBOX__API_KEY_FILE or AGENTRL_SANDBOX__API_KEY) to a key "
                              "the service holds")
        r.raise_for_status()
        return RemoteSandbox(self._client, r.json())

    def release(self, sandbox: RemoteSandbox) -> None:
        sandbox.close()

    def close(self) -> None:
        self._client.close()
