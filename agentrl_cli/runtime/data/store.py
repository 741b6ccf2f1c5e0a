"""What a trajectory store is: the `TrajectoryStore` protocol, its errors and the key rules every
store shares.

Belongs here: create-only publication of a finished file under a key, listing, reading bytes,
deleting, and reading every published file back as one table with the Hive partition columns
(`harness`, `date`) re-added. Not here: the stores themselves (`local_store.py`, `s3.py`), choosing one
(`stores.py`), building Parquet files (`writer.py`), retention (`gc.py`). Keys look like `harness=H/date=D/part-<uuid>.parquet`; names starting with `.` or `_` are
private (temp files, conflicts) and never listed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import pyarrow as pa

from agentrl_cli.runtime.data.schema import PARTITIONING, SCHEMA

PART_KEY = re.compile(r"harness=(?P<harness>[^/]+)/date=(?P<date>[^/]+)/[^/]+\.parquet")
STAGING_DIR = ".tmp"


class AlreadyExists(Exception):
    """`publish` refused: an object is already stored under that key (stores are create-only)."""


class ObjectNotFound(KeyError):
    """`get_bytes` asked for a key that is not stored."""


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    modified: datetime  # UTC


@runtime_checkable
class TrajectoryStore(Protocol):
    """A create-only store of Parquet files. `publish` consumes `local_path` when it returns."""

    url: str
    staging_dir: Path  # where writers put temp files (same file system as the store or its spool)
    stats: dict[str, int]

    def publish(self, local_path: Path, key: str) -> str:
        """Store the finished file under `key`: "published", or "spooled" (kept locally for a later
        upload). Raises `AlreadyExists` if the key exists; the file is then left where it was."""
        ...

    def list(self, prefix: str = "") -> list[ObjectInfo]: ...

    def get_bytes(self, key: str) -> bytes: ...

    def delete(self, key: str) -> None: ...

    def read_table(self, filter: Any = None) -> pa.Table: ...


def check_key(key: str) -> str:
    """`key` if it is a safe relative object key, else ValueError (no `..`, no absolute paths)."""
    parts = key.split("/")
    if (not key or key.startswith("/") or "\\" in key or "\x00" in key
            or any(p in ("", ".", "..") for p in parts) or any(p[0] in "._" for p in parts)):
        raise ValueError(f"invalid store key {key!r}: use relative names like "
                         "'harness=H/date=YYYY-MM-DD/part-<id>.parquet' (no '..', no leading '.' or '_')")
    return key


def partition_of(key: str) -> dict[str, str] | None:
    """{"harness": H, "date": D} for a published Parquet key, None for any other key."""
    m = PART_KEY.fullmatch(key)
    return m.groupdict() if m else None


def with_partitions(table: pa.Table, key: str) -> pa.Table:
    """A file's table (file schema) with the partition columns of `key` appended, in `SCHEMA` order."""
    part = partition_of(key) or {}
    for f in PARTITIONING:
        table = table.append_column(f, pa.array([part.get(f.name)] * table.num_rows, f.type))
    return table.select(SCHEMA.names)


def empty_table() -> pa.Table:
    return SCHEMA.empty_table()
