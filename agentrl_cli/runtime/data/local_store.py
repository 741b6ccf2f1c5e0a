"""The local-directory trajectory store: published files under a root directory, create-only by hard
link. Belongs here: that store only; the protocol and key rules are in `store.py`."""

from __future__ import annotations

import errno
import os
import shutil
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds

from agentrl_cli.core.fsutil import fsync_dir

from agentrl_cli.runtime.data.schema import PARTITIONING, SCHEMA
from agentrl_cli.runtime.data.store import STAGING_DIR, AlreadyExists, ObjectInfo, ObjectNotFound, check_key, empty_table, partition_of


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
