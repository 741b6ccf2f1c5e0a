"""The tool-call log: every call's inputs, outputs, status, latency and retries, by run, episode and step.

Belongs here: storing and querying call records (in memory, optionally appended to a JSON-lines
file). Not here: deciding what a call's status is (`caller.py`) or trajectory storage (Parquet).
Arguments and outputs are stored JSON-safe; one longer than `max_value_bytes` (4 KiB) is kept as
truncated JSON text with a `*_truncated` flag. Memory is bounded: past `max_entries` the oldest half
is dropped from memory (the file, if any, keeps everything).
"""

from __future__ import annotations

import copy
import json
import logging
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

log = logging.getLogger("agentrl.tools.calllog")

_FIELDS = ("run_id", "episode_id", "step", "tool", "requested_tool", "arguments", "status", "output",
           "error", "latency_ms", "retries", "attempts")


def json_safe(value: Any, max_bytes: int = 4096) -> tuple[Any, bool]:
    """(a JSON-safe copy of value, truncated?). Unserialisable objects become their repr; a value whose
    JSON is longer than max_bytes becomes its JSON text cut to max_bytes."""
    try:
        text = json.dumps(value, default=repr, ensure_ascii=False)
    except (TypeError, ValueError):  # circular references and the like
        text = json.dumps(repr(value), ensure_ascii=False)
    data = text.encode("utf-8")
    if len(data) > max_bytes:
        return data[:max_bytes].decode("utf-8", errors="ignore"), True
    return json.loads(text), False


class CallLog:
    """Thread-safe record of tool calls. `query` filters by any of run_id, episode_id, step, tool."""

    def __init__(self, path: str | Path | None = None, *, max_entries: int = 100_000,
                 max_value_bytes: int = 4096) -> None:
        if max_entries < 2:
            raise ValueError(f"CallLog max_entries must be >= 2, got {max_entries}")
        self.path = Path(path) if path is not None else None
        self.max_entries, self.max_value_bytes = max_entries, max_value_bytes
        self.write_errors = 0
        self._lock = threading.Lock()
        self._entries: dict[int, dict] = {}
        self._next = 0
        self._by_run: dict[str, list[int]] = {}
        self._by_episode: dict[str, list[int]] = {}
        self._by_step: dict[tuple[str, int], list[int]] = {}
        self._file = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a", encoding="utf-8")

    def record(self, entry: dict) -> dict:
        """Store one call; returns the stored (normalised) entry."""
        stored = {"timestamp": datetime.now(timezone.utc).isoformat()}
        stored.update({key: entry.get(key) for key in _FIELDS})
        stored.update({key: value for key, value in entry.items() if key not in stored})
        stored["run_id"], stored["episode_id"] = str(stored["run_id"] or ""), str(stored["episode_id"] or "")
        stored["step"] = int(stored["step"] or 0)
        stored["requested_tool"] = stored["requested_tool"] or stored["tool"]
        for key in ("arguments", "output"):
            stored[key], stored[f"{key}_truncated"] = json_safe(stored[key], self.max_value_bytes)
        stored["attempts"] = json_safe(stored["attempts"] or [], 1 << 20)[0]
        line = json.dumps(stored, ensure_ascii=False, default=repr) + "\n"
        with self._lock:
            seq, self._next = self._next, self._next + 1
            self._entries[seq] = stored
            self._index(seq, stored)
            if len(self._entries) > self.max_entries:
                self._evict_oldest_half()
            self._append(line)
        return stored

    def query(self, run_id: str | None = None, episode_id: str | None = None, step: int | None = None,
              tool: str | None = None) -> list[dict]:
        """Entries (copies, oldest first) matching every criterion given; `tool` matches the tool that
        answered or the one requested."""
        with self._lock:
            if episode_id is not None and step is not None:
                seqs = self._by_step.get((episode_id, step), [])
            elif episode_id is not None:
                seqs = self._by_episode.get(episode_id, [])
            elif run_id is not None:
                seqs = self._by_run.get(run_id, [])
            else:
                seqs = list(self._entries)
            found = [self._entries[s] for s in seqs if s in self._entries]
            found = [e for e in found if (run_id is None or e["run_id"] == run_id)
                     and (episode_id is None or e["episode_id"] == episode_id)
                     and (step is None or e["step"] == step)
                     and (tool is None or tool in (e["tool"], e["requested_tool"]))]
            return copy.deepcopy(found)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def __bool__(self) -> bool:  # an empty log is still a log: `log or CallLog()` must keep it
        return True

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def __enter__(self) -> "CallLog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _index(self, seq: int, entry: dict) -> None:
        self._by_run.setdefault(entry["run_id"], []).append(seq)
        self._by_episode.setdefault(entry["episode_id"], []).append(seq)
        self._by_step.setdefault((entry["episode_id"], entry["step"]), []).append(seq)

    def _evict_oldest_half(self) -> None:
        keep = sorted(self._entries)[len(self._entries) // 2:]
        self._entries = {seq: self._entries[seq] for seq in keep}
        self._by_run, self._by_episode, self._by_step = {}, {}, {}
        for seq, entry in self._entries.items():
            self._index(seq, entry)

    def _append(self, line: str) -> None:
        if self._file is None:
            return
        try:
            self._file.write(line)
            self._file.flush()
        except OSError as exc:  # a full disk must not stop tool calls; it is counted and logged
            self.write_errors += 1
            log.warning("call log %s: could not append an entry (%s); %d entries lost from the file",
                        self.path, exc, self.write_errors)
