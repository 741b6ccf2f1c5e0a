"""The client side of the sandbox service: `RemoteSandbox` has the methods harnesses use on a local
`Sandbox` (exec, write_file, read_file, close), and `RemoteProvider` hands them out like the pool,
so a harness runs unchanged against local or remote sandboxes.

Replicas: creation goes to `url` (sandbox.service_url, any replica behind a load balancer); the
replica that created a sandbox names itself in the answer (`replica`), and with `replica_url`
(sandbox.replica_url, `{replica}` filled in) every later call of that sandbox goes to that replica,
one connection pool per replica. A sandbox its replica no longer holds (404, or 421 misrouted), a
replica that cannot be reached or does not answer, or one that fails the call (5xx) raises
`SandboxLost`: the episode ends `infra_error` (masked, flagged `sandbox_lost`), never an error
observation repeated until the episode runs out. A path outside the work directory stays
`UnsafePath`, a request the service refuses (422) an error result: the caller's doing.

Images: a provider made with `image` and `image_digest` asks the service for sandboxes rooted in
that digest (`prepare()` once, at load, then each creation); a service that cannot provide it
answers 409 and the client raises `ImageError` naming the digest asked for and those the service
holds, so a harness with an image never runs on the service's host root.

Belongs here: the HTTP client of the service (`service.py`). Not here: choosing it over local
sandboxes (`provider.py`).
"""

from __future__ import annotations

import threading
from pathlib import PurePosixPath

import httpx

from agentrl_cli.config.sections.sandbox import REPLICA_NAME
from agentrl_cli.core.errors import ConfigError, EnvironmentLost
from agentrl_cli.core.httpclient import http_client
from agentrl_cli.envs.images import ImageError
from agentrl_cli.envs.sandbox.files import UnsafePath
from agentrl_cli.envs.sandbox.result import ExecResult
from agentrl_cli.envs.sandbox.sandbox import HOST_GRACE_S

LOST = (404, 410, 421)  # the replica does not hold the sandbox (closed, restarted) or is not its replica


class SandboxLost(EnvironmentLost):
    """A remote sandbox is gone: its replica died or restarted, or the call could not reach it."""

    flag = "sandbox_lost"


class RemoteSandbox:
    def __init__(self, client: httpx.Client, info: dict) -> None:
        self._client = client
        self.id = info["id"]
        self.isolated = bool(info["isolated"])
        self.workdir = PurePosixPath(info["workdir"])
        self.replica = info.get("replica") or ""  # '' from a service without replicas (or older than them)
        self.image_digest = info.get("digest") or ""  # the image the service rooted it in ('' = its host root)
        self._closed = False

    def _call(self, method: str, path: str, **kwargs) -> httpx.Response:
        """The service's answer to a call for this sandbox; `SandboxLost` when there is none, when the
        replica does not hold the sandbox (`LOST`) or when it failed the call (5xx)."""
        where = f"sandbox {self.id}" + (f" on replica {self.replica}" if self.replica else "") + f" at {self._client.base_url}"
        try:
            r = self._client.request(method, f"/sandboxes/{self.id}{path}", **kwargs)
        except httpx.HTTPError as exc:
            raise SandboxLost(f"{where} could not be reached ({type(exc).__name__}: {exc}): it is lost with its service",
                              "check the sandbox service's replicas (`agentrl serve sandbox`, their /health); the episode is "
                              "masked (infra_error), the next one gets a new sandbox") from None
        if r.status_code not in LOST and r.status_code < 500:
            return r
        detail = _detail(r)
        if r.status_code == 421:
            hint = ("set sandbox.replica_url so each sandbox's calls reach the replica that created it (the replicas "
                    "behind sandbox.service_url each hold their own sandboxes)")
        elif r.status_code >= 500:
            hint = "read the sandbox service's log for the failure; the episode is masked (infra_error)"
        else:
            hint = ("the service no longer holds it (it restarted, or reclaimed it after sandbox.lease_timeout_s); the "
                    "episode is masked (infra_error), the next one gets a new sandbox")
        raise SandboxLost(f"{where} answered {r.status_code}: {detail}", hint)

    def exec(self, command, timeout: float | None = None, stdin: str | None = None, env: dict | None = None,
             cwd: str | None = None, cpu_time_s: int | None = None) -> ExecResult:
        body = {"command": command, "timeout": timeout, "stdin": stdin, "env": env, "cpu_time_s": cpu_time_s}
        r = self._call("POST", "/exec", json=body, timeout=(timeout or 600) + HOST_GRACE_S + 5)
        if r.status_code >= 400:  # the request itself (422: an empty command, a timeout past the service's bound)
            return ExecResult(exit_code=None, error=f"the sandbox service refused the command ({r.status_code}): {_detail(r)}")
        data = r.json()
        data.pop("status", None)
        return ExecResult(**data)

    def write_file(self, relpath: str, data: bytes | str, mode: int = 0o644) -> None:
        r = self._call("PUT", "/files", params={"path": relpath}, content=data.encode() if isinstance(data, str) else data)
        if r.status_code == 400:
            raise UnsafePath(_detail(r), "use a relative path inside the work directory")
        r.raise_for_status()

    def read_file(self, relpath: str, max_bytes: int = 1 << 20) -> bytes:
        r = self._call("GET", "/files", params={"path": relpath, "max_bytes": max_bytes})
        if r.status_code == 400:
            raise UnsafePath(_detail(r), "results must be plain files inside the work directory")
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

    def held(self) -> bool | None:
        """Whether the service (this sandbox's replica) still holds it, closed or not: the work directory
        lives on the service's host, so only the service can say; None when it does not answer."""
        try:
            r = self._client.get(f"/sandboxes/{self.id}/resources")
        except httpx.HTTPError:
            return None
        return None if r.status_code >= 500 else r.status_code not in LOST

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                self._client.delete(f"/sandboxes/{self.id}")
            except httpx.HTTPError:
                pass  # the service reclaims stragglers by lease timeout


def _detail(r: httpx.Response) -> str:
    try:
        detail = r.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    return str(detail) if detail else (r.text[:300] or r.reason_phrase or "refused")


def _json_detail(r: httpx.Response) -> dict:
    try:
        detail = r.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    return detail if isinstance(detail, dict) else {"message": str(detail or r.text[:300] or r.reason_phrase)}


class RemoteProvider:
    """acquire/release over the sandbox service at `url`, sending `api_key` (sandbox.api_key's current key);
    `replica_url` (sandbox.replica_url): where a sandbox's later calls go, `{replica}` its creator's name;
    `image`, `image_digest`: the image its sandboxes are rooted in ('' = the service host's root)."""

    def __init__(self, url: str, timeout_s: float = 60.0, api_key: str | None = None, replica_url: str = "",
                 image: str = "", image_digest: str = "") -> None:
        self.url = url.rstrip("/")
        self.replica_url = replica_url
        self.image, self.image_digest = image, image_digest
        self._timeout_s = timeout_s
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        self._client = self._new_client(self.url)
        self._replicas: dict[str, httpx.Client] = {}  # replica URL -> its own connection pool
        self._lock = threading.Lock()

    def _new_client(self, url: str) -> httpx.Client:
        return http_client(base_url=url, timeout=self._timeout_s, headers=self._headers)

    def client_for(self, replica: str) -> httpx.Client:
        """The client that reaches `replica` (the load-balanced one without a replica or a replica_url)."""
        if not replica or not self.replica_url:
            return self._client
        if not REPLICA_NAME.fullmatch(replica):  # it becomes part of a URL this client sends its key to
            raise SandboxLost(f"the sandbox service {self.url} named its replica {replica!r}, which is not a host name",
                              "give each replica a host name as sandbox.replica (the rendered pods use their own names)")
        url = self.replica_url.replace("{replica}", replica).rstrip("/")
        with self._lock:
            if url not in self._replicas:
                self._replicas[url] = self._new_client(url)
            return self._replicas[url]

    def _image_body(self) -> dict | None:
        return {"image": self.image, "digest": self.image_digest} if self.image else None

    def _checked(self, r: httpx.Response) -> dict:
        if r.status_code == 401:
            raise ConfigError(f"the sandbox service {self.url} refused this client's key (401)",
                              "set sandbox.api_key (AGENTRL_SANDBOX__API_KEY_FILE or AGENTRL_SANDBOX__API_KEY) to a key "
                              "the service holds")
        if self.image and r.status_code in (404, 409, 422):
            detail = _json_detail(r)
            if r.status_code != 409:  # a service older than images: no /images, or a body it does not take
                raise ImageError(self.image, f"the sandbox service {self.url} does not run images ({r.status_code}), so it "
                                 f"cannot provide {self.image_digest}", "upgrade the sandbox service, or unset sandbox.service_url")
            raise ImageError(self.image, f"the sandbox service {self.url} cannot provide digest {self.image_digest}: "
                             f"{detail.get('message', detail)}", str(detail.get("hint", "")))
        r.raise_for_status()
        return r.json()

    def prepare(self) -> None:
        """With an image: make sure the service can provide it (its warm pool made now); ImageError otherwise."""
        if self.image:
            try:
                r = self._client.post("/images", json=self._image_body())
            except httpx.HTTPError as exc:
                raise ConfigError(f"the sandbox service {self.url} could not be reached to prepare image {self.image!r} "
                                  f"({type(exc).__name__}: {exc})", "start it (`agentrl serve sandbox`) or fix sandbox.service_url") from None
            self._checked(r)

    def acquire(self) -> RemoteSandbox:
        info = self._checked(self._client.post("/sandboxes", json=self._image_body()))
        if self.image and info.get("digest") != self.image_digest:
            raise ImageError(self.image, f"the sandbox service {self.url} gave a sandbox rooted in "
                             f"{info.get('digest') or 'its host root'}, not {self.image_digest}",
                             "upgrade the sandbox service: this one ignores the image a client asks for")
        return RemoteSandbox(self.client_for(info.get("replica") or ""), info)

    def release(self, sandbox: RemoteSandbox) -> None:
        sandbox.close()

    def close(self) -> None:
        with self._lock:
            replicas, self._replicas = list(self._replicas.values()), {}
        for client in [self._client, *replicas]:
            client.close()
