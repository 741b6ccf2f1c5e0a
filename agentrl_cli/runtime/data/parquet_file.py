"""One Parquet file written row group by row group while its rows are still arriving.

`add(table, items)` hands a built Arrow table to a background encoder thread (the `prepare` step, which
the writer uses for redaction, then Arrow's Parquet writer, which releases the GIL) and returns at once,
so the caller builds the next row group, or simply goes on with its work, while this one is encoded.
Each encoded row group is flushed to disk (`fdatasync`) in the background too, so `finish` waits only
for the last one. Errors surface at the next `add` or at `finish`; `abort` removes the file.
Belongs here: the file's encode/sync pipeline. Not here: which rows go in a file, validation,
quarantine, publishing (`writer.py`).
"""

from __future__ import annotations

import os
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.parquet as pq


class RowGroupFile:
    """A Parquet file at `path` (which may already exist, empty, e.g. from `mkstemp`), one row group per
    `add`. Not thread-safe: one thread adds and finishes. `encoder` and `syncer` may be executors shared
    by many files (a long-lived writer keeps its threads instead of starting two per file); a file
    never has two row groups encoding at once, since `add` waits for the previous one."""

    def __init__(self, path: str | os.PathLike, schema: pa.Schema, *,
                 prepare: Callable[[pa.Table], pa.Table] | None = None, encoder: Executor | None = None,
                 syncer: Executor | None = None, **writer_options: Any) -> None:
        self.path, self.schema, self.prepare, self.options = Path(path), schema, prepare, writer_options
        self.items: list = []  # what the row groups hold, in order
        self._writer: pq.ParquetWriter | None = None
        self._fd = -1
        self._pending: Future | None = None
        self._syncing: list[Future] = []
        self._encoder = encoder or ThreadPoolExecutor(max_workers=1, thread_name_prefix="parquet-encode")
        self._syncer = syncer or ThreadPoolExecutor(max_workers=1, thread_name_prefix="parquet-sync")
        self._owned = [p for p, given in ((self._encoder, encoder), (self._syncer, syncer)) if given is None]

    def add(self, table: pa.Table, items: list) -> None:
        """Queue `table` as the next row group. Raises the previous row group's error, if it failed."""
        if self._writer is None:
            # by path: Arrow's own file stream, so encoding holds no GIL per write
            self._writer = pq.ParquetWriter(str(self.path), self.schema, **self.options)
            self._fd = os.open(self.path, os.O_RDONLY)
        if self._pending is not None:
            self._pending.result()
            self._syncing.append(self._syncer.submit(os.fdatasync, self._fd))
        self._pending = self._encoder.submit(self._encode, table)
        self.items += items

    def _encode(self, table: pa.Table) -> None:
        if self.prepare is not None:
            table = self.prepare(table)  # before a single byte of it reaches the file
        self._writer.write_table(table)

    def finish(self) -> list:
        """Wait for the last row group, write the footer, fsync; returns the items written. On error
        the file is left as it is (call `abort`)."""
        try:
            if self._pending is not None:
                self._pending.result()
            if self._writer is not None:
                self._writer.close()
            # a failed early sync fails the file: after an fsync error the kernel may have dropped the
            # pages, and a later fsync would report success (the "fsyncgate" lesson)
            failed = next((e for e in (f.exception() for f in self._syncing) if e is not None), None)
            if failed is not None:
                raise failed
            if self._fd >= 0:
                os.fsync(self._fd)
        finally:
            self._release()
        return self.items

    def abort(self) -> None:
        """Stop, close what is open (errors ignored) and remove the file."""
        try:
            self._release()
        finally:
            self.path.unlink(missing_ok=True)

    def _release(self) -> None:
        if self._pending is not None:
            self._pending.exception()  # waits: never close the file under a running encode
        for f in self._syncing:
            f.exception()
        try:
            if self._writer is not None and self._writer.is_open:
                self._writer.close()
        except Exception:  # noqa: BLE001 - already failing; the caller reports the first error
            pass
        finally:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            for pool in self._owned:
                pool.shutdown(wait=False)
