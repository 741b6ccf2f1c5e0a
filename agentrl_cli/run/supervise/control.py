"""Elastic inference through a file: inference servers join and leave a running run without a new
network port (so no new surface to authenticate).

- `<run dir>/control/servers.json` ({"add": [URL...], "remove": [URL...]}): what `agentrl run
  servers add|remove URL` asked for, written under a lock. The run reads it on every health tick of
  its supervisor and applies what changed since it last looked: an added URL joins (health, then the
  run's weights, verified, then rotation); a removed one leaves the rotation at once (a server the
  run started keeps running until the run ends; requests it has in flight finish there).
- `<run dir>/control/status.json`: what the run's supervisor sees (components, status, restarts,
  rotation, weight version, the latest events), written by the run when it changes; `agentrl run
  servers list` reads it.

The run sends its inference key to every server in rotation, so it acts only on a requests file
owned by its own user and writable by nobody else (the control directory is made 0700, the file 0600).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Awaitable, Callable
from urllib.parse import urlsplit

from agentrl_cli.core.errors import UsageError

log = logging.getLogger(__name__)

CONTROL_DIR, REQUESTS, STATUS = "control", "servers.json", "status.json"
ACTIONS = ("add", "remove")


def server_url(url: str) -> str:
    """`url` as the run keys servers by (scheme://host:port); UsageError for anything else."""
    parts = urlsplit(url.strip())
    try:
        port = parts.port
    except ValueError:
        port = None
    if (parts.scheme not in ("http", "https") or not parts.hostname or port is None or parts.username or parts.password
            or parts.path not in ("", "/") or parts.query or parts.fragment):
        raise UsageError(f"bad server URL {url!r}: give scheme, host and port only",
                         "for example http://10.0.0.7:30000 (an `agentrl serve inference` or SGLang server)")
    return f"{parts.scheme}://{parts.netloc}"


def _private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def _write(path: Path, text: str) -> None:
    """Replace `path` with `text` atomically (mode 0600)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def _locked(control: Path):
    with open(_private_dir(control) / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def read_requests(control: Path) -> dict[str, list[str]]:
    """The requests file's {"add": [...], "remove": [...]} (empty lists when there is none)."""
    try:
        data = json.loads((control / REQUESTS).read_text(encoding="utf-8"))
    except FileNotFoundError:
        data = {}
    if not isinstance(data, dict) or not all(isinstance(data.get(a, []), list) for a in ACTIONS):
        raise ValueError(f"{control / REQUESTS} is not of the form {{\"add\": [URL...], \"remove\": [URL...]}}")
    return {a: [str(u) for u in data.get(a, [])] for a in ACTIONS}


def request(control: Path, action: str, url: str) -> dict[str, list[str]]:
    """Record that server `url` is to join (`add`) or leave (`remove`) the run; returns all requests."""
    if action not in ACTIONS:
        raise ValueError(f"action must be one of {ACTIONS}, got {action!r}")
    url = server_url(url)
    with _locked(control):
        try:
            requests = read_requests(control)
        except (ValueError, json.JSONDecodeError):
            requests = {a: [] for a in ACTIONS}  # a broken file is replaced
        other = "remove" if action == "add" else "add"
        requests[other] = [u for u in requests[other] if u != url]
        if url not in requests[action]:
            requests[action].append(url)
        _write(control / REQUESTS, json.dumps(requests, indent=2) + "\n")
    return requests


def read_status(control: Path) -> dict | None:
    try:
        return json.loads((control / STATUS).read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return None


class ServerControl:
    """The run's side: `await tick()` (from the supervisor's `on_tick`) applies the requests that
    changed through `join(url)` / `leave(url)`, and writes `status()` to status.json when it changed."""

    def __init__(self, control: Path, join: Callable[[str], Awaitable[None]], leave: Callable[[str], Awaitable[None]],
                 status: Callable[[], dict]) -> None:
        self.control = _private_dir(Path(control))
        self.join, self.leave, self.status = join, leave, status
        self.applied: dict[str, str] = {}  # url -> the last action applied to it
        self._seen: tuple | None = None
        self._written = ""

    async def tick(self) -> None:
        await self._apply()
        text = json.dumps({"pid": os.getpid(), **self.status()}, indent=2, default=str) + "\n"
        if text != self._written:
            _write(self.control / STATUS, text)
            self._written = text

    async def _apply(self) -> None:
        path = self.control / REQUESTS
        try:
            st = path.stat()
        except FileNotFoundError:
            return
        seen = (st.st_mtime_ns, st.st_size, st.st_ino)
        if seen == self._seen:
            return
        self._seen = seen
        if st.st_uid != os.getuid() or st.st_mode & 0o022:
            log.error("ignoring %s: it must belong to this user and be writable by no one else (chmod 600 it)", path)
            return
        try:
            requests = read_requests(self.control)
        except (ValueError, OSError) as exc:
            log.error("ignoring %s: %s", path, exc)
            return
        wanted: dict[str, str] = {}
        for action in ACTIONS:
            for url in requests[action]:
                try:
                    wanted[server_url(url)] = action
                except UsageError as exc:
                    log.error("ignoring %s in %s: %s", url, path, exc.message)
        for url, action in wanted.items():
            if self.applied.get(url) != action:
                await (self.join if action == "add" else self.leave)(url)
                self.applied[url] = action
