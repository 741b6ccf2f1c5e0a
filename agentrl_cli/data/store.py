"""Where published Parquet files live: the `TrajectoryStore` protocol, the local-directory store, and
`open_store` to pick one from `DataConfig`.

Belongs here: create-only publication of a finished file under a key, listing, reading bytes,
deleting, and reading every published file back as one table with the Hive partition columns
(`harness`, `date`) re-added. Not here: building Parquet files (`writer.py`), S3 (`s3.py`), retention
(`gc.py`). Keys look like `harness=H/date=D/part-<uuid>.parquet`; names starting with `.` or `_` are
private (temp files, conflicts) and never listed.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import pyarrow as pa
import pyarrow.dataset as ds

from .schema import PARTITIONING, SCHEMA

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


def fsync_dir(path: Path) -> None:
    """Make a rename or link inside `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalStore:
    """Published files under `<root>/<key>`, temp files under `<root>/.tmp`.

    Publication is a hard link (atomic, fails if the name exists), so a file appears under its final
    name complete or not at all, and two writers never overwrite each other."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).expanduser().absolute()
        self.staging_dir = self.root / STAGING_DIR
        self.url = self.root.as_uri()
        self.stats: dict[str, int] = {"published": 0}

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def publish(self, local_path: Path, key: str) -> str:
        final = self._path(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(local_path, final)
        except FileExistsError:
            raise AlreadyExists(f"{self.url}/{key} already exists; stores are create-only") from None
        except OSError as e:
            if e.errno != errno.EXDEV:
                raise
            self._copy_then_link(Path(local_path), final)  # the temp file was on another file system
        Path(local_path).unlink()
        for directory in (final.parent, *final.parent.parents):  # new partition directories included
            fsync_dir(directory)
            if directory == self.root:
                break
        self.stats["published"] += 1
        return "published"

    @staticmethod
    def _copy_then_link(src: Path, final: Path) -> None:
        tmp = final.parent / f".{final.name}.{uuid.uuid4().hex}.tmp"
        try:
            with src.open("rb") as r, tmp.open("xb") as w:
                shutil.copyfileobj(r, w, 1 << 20)
                w.flush()
                os.fsync(w.fileno())
            try:
                os.link(tmp, final)
            except FileExistsError:
                raise AlreadyExists(f"{final} already exists; stores are create-only") from None
        finally:
            tmp.unlink(missing_ok=True)

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        out = []
        if not self.root.is_dir():
            return out
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames[:] = sorted(d for d in dirnames if d[0] not in "._")
            rel_dir = Path(dirpath).relative_to(self.root)
            for name in sorted(filenames):
                if name[0] in "._":
                    continue
                key = (rel_dir / name).as_posix()
                if not key.startswith(prefix):
                    continue
                try:
                    st = os.stat(Path(dirpath) / name)
                except FileNotFoundError:  # deleted while listing
                    continue
                out.append(ObjectInfo(key, st.st_size, datetime.fromtimestamp(st.st_mtime, timezone.utc)))
        return sorted(out, key=lambda info: info.key)

    def get_bytes(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, IsADirectoryError):
            raise ObjectNotFound(f"{self.url}/{key} is not in the store") from None

    def delete(self, key: str) -> None:
        path = self._path(key)
        path.unlink(missing_ok=True)
        for parent in path.parents:  # drop emptied partition directories
            if parent == self.root or not parent.is_relative_to(self.root):
                break
            try:
                parent.rmdir()
            except OSError:
                break

    def read_table(self, filter: Any = None) -> pa.Table:
        """Every published Parquet file, partition columns included, optionally filtered."""
        paths = [str(self.root / info.key) for info in self.list() if partition_of(info.key)]
        if not paths:
            return empty_table() if filter is None else empty_table().filter(filter)
        dataset = ds.dataset(paths, schema=SCHEMA, format="parquet", partition_base_dir=str(self.root),
                             partitioning=ds.partitioning(PARTITIONING, flavor="hive"))
        return dataset.to_table(filter=filter).select(SCHEMA.names)


def open_store(data_config: Any) -> TrajectoryStore:
    """The store `data.store` names: "local" (files under `data.root`) or "s3" (spooling under
    `data.root/spool`)."""
    if data_config.store == "local":
        return LocalStore(data_config.root)
    if data_config.store == "s3":
        from .s3 import S3Store

        return S3Store.from_config(data_config)
    raise ValueError(f"data.store must be 'local' or 's3', got {data_config.store!r}")

