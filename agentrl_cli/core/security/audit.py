"""The audit log: one JSON line per security-relevant request (a sandbox execution, a control-plane
write, a weight update, session management at the gateway, any request refused for its key).

A line: {"time" (UTC, ISO 8601), "service", "key_id" (`keys.key_id` of the key that was accepted;
null when none was needed or none matched), "method", "endpoint" (the path, never the query string),
"outcome" ("ok", "unauthorized", "failed"), "status" (the HTTP status), "client" (address)}. A line
never holds a key, a request body or a query string.

`observe.audit_log` says where lines go: a file (appended with one write per line, so several
processes can share it; created readable by its owner only), `-` for stderr (a pod's log), empty
for `<observe.runs_dir>/audit.jsonl`. A file that cannot be opened sends the lines to stderr, with
one warning: the record is never dropped in silence.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from datetime import datetime, timezone
from pathlib import Path

log = logging.getLogger(__name__)
STDERR = "-"


def audit_path(config) -> str:
    """Where `config` (the whole platform config) sends audit lines: a path, or "-" for stderr."""
    obs = config.observe
    return obs.audit_log or str(Path(obs.runs_dir) / "audit.jsonl")


def outcome_of(status: int) -> str:
    if status in (401, 403):
        return "unauthorized"
    return "ok" if status < 400 else "failed"


class AuditLog:
    def __init__(self, path: str | os.PathLike, service: str) -> None:
        self.path, self.service = str(path), service
        self._lock = threading.Lock()
        self._warned = False

    @classmethod
    def from_config(cls, config, service: str) -> "AuditLog":
        return cls(audit_path(config), service)

    def record(self, *, key_id: str | None, method: str, endpoint: str, status: int, client: str | None = None,
               outcome: str | None = None) -> dict:
        """Append one line; returns it."""
        line = {"time": datetime.now(timezone.utc).isoformat(timespec="milliseconds"), "service": self.service,
                "key_id": key_id, "method": method, "endpoint": endpoint, "outcome": outcome or outcome_of(status),
                "status": status, "client": client}
        self._write(json.dumps(line, separators=(",", ":")) + "\n")
        return line

    def _write(self, text: str) -> None:
        if self.path != STDERR:
            try:
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                try:
                    os.write(fd, text.encode())
                finally:
                    os.close(fd)
                return
            except OSError as exc:
                with self._lock:
                    if not self._warned:
                        self._warned = True
                        log.warning("audit log %s cannot be written (%s); audit lines go to stderr", self.path, exc)
        try:
            sys.stderr.write("audit " + text)
            sys.stderr.flush()
        except (OSError, ValueError):
            pass  # stderr closed: nowhere left to write
