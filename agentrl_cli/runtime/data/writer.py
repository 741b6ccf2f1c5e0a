"""Writing trajectory records to a store as Parquet files, and reading them back.

Belongs here: validation, redaction of the Arrow table before any byte is written, quarantine of rows that do not match the schema
(docs/security.md row 27), buffering per (harness, date) partition, and the crash-safe file protocol
(rows 25, 26): temp file on the store's staging file system → zstd Parquet → fsync → reopen and check
the footer → `store.publish` (create-only). A failed flush removes its temp file, raises, and keeps
the rows buffered. Files are written while rows arrive: every CHUNK_ROWS rows of a partition become a
row group, encoded in the background (`parquet_file.RowGroupFile`), so a flush has only the last
one left to encode. Also `read_records` / `find_trajectory`. Not here: stores (`store.py`, `s3.py`),
the schema itself (`schema.py`), retention (`gc.py`).

Publishing has a deadline (`write_timeout_s`, `data.write_timeout_s`): a flush, or the publish a
full partition makes, that has not finished by then raises `StoreTimeout` instead of hanging on a
store that does not answer, and the writer refuses further work (its publish may still be running).
A flush also uploads what an S3 store spooled during an outage (`S3Store.upload_spool`).

With `call_log` (on in `open_writer`, the rollout's writer) every published trajectory file is
followed by a call-log file of the same partition holding the tool calls of its trajectories
(`calls.py`). A call-log file that fails to publish waits in the writer (its trajectories are
published and not written again), is retried by every flush, and a flush that still cannot publish
it raises `WriteError`.
"""

from __future__ import annotations

import datetime as dt
import errno
import functools
import json
import logging
import os
import re
import tempfile
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from agentrl_cli.core.errors import AgentrlError

from agentrl_cli.runtime.data.calls import calls_table, publish_calls
from agentrl_cli.core.redact import Redactor
from agentrl_cli.runtime.data.columnar import check_scalars, records_table
from agentrl_cli.runtime.data.parquet_file import RowGroupFile
from agentrl_cli.runtime.data.schema import FILE_SCHEMA, NUMERIC_LISTS, TrajectoryRecord, to_table, validate_row
from agentrl_cli.runtime.data.store import TrajectoryStore

log = logging.getLogger("agentrl.data.writer")

_PARTITION_VALUE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}")  # a registered name or a module:Class path
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


# Statistics only for scalar columns (min/max drive filter pushdown); none for the long numeric lists,
# and no dictionary encoding: both cost more encode time than they save (measured by benchmarks/data.py).
_SCALAR_COLUMNS = [f.name for f in FILE_SCHEMA if not pa.types.is_nested(f.type) and not pa.types.is_binary(f.type)]
CHUNK_ROWS = 256  # rows per row group; one is encoded while the next arrives and is built
_ENCODERS = 3  # row groups of different files encoded at once (one per partition flushing in parallel)
# Float training arrays (log-probs) are near-incompressible: zstd at its fastest level saves none of their
# bytes and costs 1.8x the time of storing them as they are, so they are stored uncompressed.
_RAW = {name for name, dtype in NUMERIC_LISTS.items() if dtype.kind == "f"}


@functools.cache
def _leaf_columns() -> tuple[str, ...]:
    """The file schema's Parquet leaf column paths (`steps.list.element.action`, ...): per-column
    writer options name leaves, not top-level fields."""
    sink = pa.BufferOutputStream()
    pq.write_table(FILE_SCHEMA.empty_table(), sink)
    schema = pq.ParquetFile(pa.BufferReader(sink.getvalue())).schema
    return tuple(schema.column(i).path for i in range(len(schema)))


def _codecs(compression: str | None) -> str | dict | None:
    if compression is None:
        return None
    return {path: "none" if path in _RAW else compression for path in _leaf_columns()}


class WriteError(OSError):
    """A Parquet file could not be written or published; its rows are still buffered."""


class StoreTimeout(AgentrlError):
    """Publishing to the trajectory store did not finish within `data.write_timeout_s`."""

    exit_code = 1


def _partition_errors(row: dict) -> list[str]:
    errors = []
    harness, date = row.get("harness"), row.get("date")
    if isinstance(harness, str) and not _PARTITION_VALUE.fullmatch(harness):
        errors.append(f"harness: {harness!r} cannot name a partition directory (letters, digits, '_.:-')")
    if isinstance(date, str) and not _DATE.fullmatch(date):
        errors.append(f"date: {date!r} is not YYYY-MM-DD")
    return errors


class TrajectoryWriter:
    """Buffers validated rows and publishes one Parquet file per partition every `rows_per_file` rows.

    `write` returns False for a quarantined row. `flush` (and `close`, and a `write` that fills a
    partition) may raise `WriteError`; nothing is lost then: the rows stay buffered for the next flush.
    One writer per thread: it holds no lock."""

    def __init__(self, store: TrajectoryStore, *, rows_per_file: int = 1024, compression: str = "zstd",
                 redactor: Redactor | None = None, quarantine_dir: str | Path | None = None,
                 write_timeout_s: float | None = None, call_log: bool = False) -> None:
        if rows_per_file < 1:
            raise ValueError(f"rows_per_file must be >= 1, got {rows_per_file} (set data.rows_per_file)")
        self.store, self.rows_per_file, self.redactor = store, rows_per_file, redactor
        self.write_timeout_s = write_timeout_s  # None: no deadline
        self._timed_out: StoreTimeout | None = None  # set once a publish missed its deadline
        self.compression = None if compression == "none" else compression
        self.quarantine_dir = Path(quarantine_dir) if quarantine_dir is not None else None
        self.stats = {"rows_written": 0, "files": 0, "bytes": 0, "quarantined": 0, "spooled": 0, "calls_logged": 0}
        self.call_log = call_log
        self._calls_pending: list[tuple[tuple[str, str], pa.Table]] = []  # call-log files not yet published
        self._buffers: dict[tuple[str, str], list[dict]] = {}
        # per partition: its temp file being written, how many of its buffered rows that file holds,
        # and whether writing ahead failed (then the rows wait for the flush, which starts afresh)
        self._files: dict[tuple[str, str], RowGroupFile] = {}
        self._encoded: dict[tuple[str, str], int] = {}
        self._ahead_failed: set[tuple[str, str]] = set()
        self._pools: tuple[ThreadPoolExecutor, ThreadPoolExecutor] | None = None  # (encoders, syncers) of all files
        self._lock = threading.Lock()  # guards stats and buffers while partitions flush in parallel
        # One chunk is built (Python, GIL-bound) at a time: builders of parallel partitions would only
        # trade the GIL back and forth, and starve the encoder threads that need it between C++ calls.
        self._build_lock = threading.Lock()

    @property
    def buffered(self) -> int:
        """Rows accepted but not yet in a published (or spooled) file (call-log rows not counted)."""
        return sum(len(rows) for rows in self._buffers.values())

    def write(self, record: TrajectoryRecord | dict) -> bool:
        """Validate and buffer one trajectory; False (and quarantined) if it breaks the schema.

        A dict row is validated in full here. A TrajectoryRecord gets the cheap top-level check here
        and the rest when its file is built (Arrow refuses mistyped values; the record is then found
        with `validate_row`, quarantined, and the others are written)."""
        if self._timed_out is not None:
            raise self._timed_out
        if isinstance(record, TrajectoryRecord):
            errors = check_scalars(record)
            item, row = record, None
            if not errors:
                row = {"harness": record.harness, "date": record.date}
                if (row["harness"], row["date"]) not in self._buffers:
                    errors = _partition_errors(row)
        else:
            item = row = dict(record)
            errors = validate_row(row) or _partition_errors(row)
        if errors:
            self._quarantine(record.to_row() if isinstance(record, TrajectoryRecord) else row, errors)
            return False
        part = (row["harness"], row["date"])
        rows = self._buffers.setdefault(part, [])
        rows.append(item)
        if len(rows) >= self.rows_per_file:
            self._within_deadline(lambda: self._flush_partition(part), f"publishing {len(rows)} trajectories")
        elif len(rows) - self._encoded.get(part, 0) >= CHUNK_ROWS and part not in self._ahead_failed:
            self._write_ahead(part)
        return True

    def _write_ahead(self, part: tuple[str, str]) -> None:
        """Start encoding the partition's full chunks into its temp file. A failure here is not the
        caller's: the file is dropped, the rows stay buffered, and the flush writes them afresh (and
        raises if it fails again)."""
        try:
            self._add_chunks(part, final=False)
        except Exception as e:  # noqa: BLE001 - whatever it was, the flush retries it and raises
            where = self._files[part].path if part in self._files else self.store.staging_dir
            log.warning("writing ahead for partition %s failed (%s); its %d rows stay buffered for the next flush",
                        "/".join(part), _describe(e, where) if isinstance(e, OSError) else repr(e),
                        len(self._buffers.get(part, [])))
            self._drop_file(part)
            self._ahead_failed.add(part)

    def _add_chunks(self, part: tuple[str, str], *, final: bool) -> None:
        """Build the partition's buffered rows not yet in its file into row groups of CHUNK_ROWS and
        hand them to the file (the last, short one too when `final`). Quarantined rows leave the buffer."""
        rows = self._buffers[part]
        while True:
            start = self._encoded.get(part, 0)
            n = min(len(rows) - start, CHUNK_ROWS)
            if n <= 0 or (n < CHUNK_ROWS and not final):
                return
            with self._build_lock:
                table, kept = self._chunk_table(rows[start:start + n])
            rows[start:start + n] = kept
            if table is None:
                continue
            f = self._files.get(part)
            if f is None:
                f = self._files[part] = self._open_file()
            f.add(table, kept)
            self._encoded[part] = start + len(kept)

    def _open_file(self) -> RowGroupFile:
        self.store.staging_dir.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix="part-", suffix=".parquet.tmp", dir=self.store.staging_dir)
        os.close(fd)
        if self._pools is None:  # threads started once, not twice per file; closed by `close`
            self._pools = (ThreadPoolExecutor(max_workers=_ENCODERS, thread_name_prefix="parquet-encode"),
                           ThreadPoolExecutor(max_workers=2, thread_name_prefix="parquet-sync"))
        return RowGroupFile(name, FILE_SCHEMA, prepare=self.redactor.table if self.redactor is not None else None,
                            encoder=self._pools[0], syncer=self._pools[1], compression=_codecs(self.compression),
                            use_dictionary=False, write_statistics=_SCALAR_COLUMNS)

    def _drop_file(self, part: tuple[str, str]) -> None:
        """Abort the partition's temp file (removing it); its rows, still buffered, start afresh."""
        self._encoded.pop(part, None)
        f = self._files.pop(part, None)
        if f is not None:
            f.abort()

    def _quarantine(self, row: dict, errors: list[str]) -> None:
        with self._lock:
            self._quarantine_locked(row, errors)

    def _quarantine_locked(self, row: dict, errors: list[str]) -> None:
        self.stats["quarantined"] += 1
        if self.redactor is not None:  # the errors quote the offending values
            row, errors = self.redactor.row(row), [self.redactor.text(e) for e in errors]
        tid = row.get("trajectory_id")
        if self.quarantine_dir is None:
            log.warning("trajectory %s rejected (no quarantine_dir, not kept): %s", tid, "; ".join(errors))
            return
        self.quarantine_dir.mkdir(parents=True, exist_ok=True)
        path = self.quarantine_dir / "quarantine.jsonl"
        line = json.dumps({"quarantined_at": dt.datetime.now(dt.timezone.utc).isoformat(), "errors": errors,
                           "row": row}, default=str, ensure_ascii=False)
        with path.open("a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())
        log.warning("trajectory %s quarantined to %s: %s", tid, path, "; ".join(errors))

    def flush(self) -> None:
        """Publish every buffered partition, then what the store spooled in an outage. On error the
        failed partitions stay buffered and the first error is raised after all have tried; past
        `write_timeout_s`, `StoreTimeout`."""
        if self._timed_out is not None:
            raise self._timed_out
        self._within_deadline(self._flush_all, f"flushing {self.buffered} trajectories")

    def _within_deadline(self, work, what: str) -> None:
        """`work()` in a thread this one waits for at most `write_timeout_s` (then StoreTimeout)."""
        if self.write_timeout_s is None:
            return work()
        done: dict = {}

        def run() -> None:
            try:
                work()
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
                done["error"] = exc
        worker = threading.Thread(target=run, name="store-write", daemon=True)
        worker.start()
        worker.join(self.write_timeout_s)
        if worker.is_alive():
            self._timed_out = StoreTimeout(
                f"the trajectory store {self.store.url} did not finish {what} within {self.write_timeout_s:g} s "
                "(data.write_timeout_s); the writer stops here, its rows unpublished",
                "check that the store answers (`agentrl bench store`); a slow store may need a larger data.write_timeout_s")
            raise self._timed_out
        if "error" in done:
            raise done["error"]

    def _flush_all(self) -> None:
        parts = [p for p in list(self._buffers) if self._buffers.get(p)]
        # partitions in parallel: one builds (Python) while others encode (C++, GIL released)
        with ThreadPoolExecutor(max_workers=max(1, min(len(parts), _ENCODERS)), thread_name_prefix="flush") as pool:
            futures = [pool.submit(self._flush_partition, part) for part in parts]
        errors = [f.exception() for f in futures if f.exception() is not None]
        if errors:
            raise errors[0]
        if self._calls_pending:
            self._publish_pending_calls(raise_errors=True)
        spooled = getattr(self.store, "spooled", None)
        if spooled is not None and spooled():
            self.store.upload_spool(attempts=1)

    def _chunk_table(self, items: list):
        """(Arrow table, items in it) for one chunk; mistyped records are quarantined and left out."""
        try:
            if all(isinstance(i, TrajectoryRecord) for i in items):
                return records_table(items), items
            return to_table([i.to_row() if isinstance(i, TrajectoryRecord) else i for i in items]), items
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
            keep = []
            for item in items:
                row = item.to_row() if isinstance(item, TrajectoryRecord) else item
                errors = validate_row(row)
                if errors:
                    self._quarantine(row, errors)
                else:
                    keep.append(item)
            if len(keep) == len(items):
                raise WriteError(f"cannot encode {len(items)} trajectories: {exc}; they are still buffered") from exc
            return self._chunk_table(keep) if keep else (None, [])

    def _flush_partition(self, part: tuple[str, str]) -> None:
        key = f"harness={part[0]}/date={part[1]}/part-{uuid.uuid4().hex}.parquet"
        self._ahead_failed.discard(part)
        tmp = self._files[part].path if part in self._files else None
        try:
            self._add_chunks(part, final=True)
            f = self._files.get(part)
            if f is None:  # every record was quarantined
                with self._lock:
                    del self._buffers[part]
                return
            tmp = f.path
            rows = f.finish()
            check_parquet(tmp, len(rows))
            size = tmp.stat().st_size
            outcome = self.store.publish(tmp, key)
        except OSError as e:
            self._drop_file(part)
            n = len(self._buffers.get(part, []))
            message = (f"could not write {n} trajectories to {self.store.url}/{key}: {_describe(e, tmp or self.store.staging_dir)}; "
                       "they are still buffered, so fix the cause and flush again")
            raise (WriteError(e.errno, message) if e.errno else WriteError(message)) from e
        except BaseException:
            self._drop_file(part)
            raise
        tmp.unlink(missing_ok=True)  # a store consumes the file; this only matters for one that copies
        with self._lock:
            self._files.pop(part, None)
            self._encoded.pop(part, None)
            del self._buffers[part]
            self.stats["rows_written"] += len(rows)
            self.stats["files"] += 1
            self.stats["bytes"] += size
            self.stats["spooled"] += outcome == "spooled"
        if self.call_log:
            self._log_calls(part, rows)

    def _log_calls(self, part: tuple[str, str], items: list) -> None:
        """Queue the call-log file of the trajectories just published and publish what is queued."""
        try:
            table = calls_table(items)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
            log.error("the tool calls of %d trajectories in %s could not be put in the call log: %s",
                      len(items), "/".join(part), exc)
            return
        if table.num_rows:
            with self._lock:
                self._calls_pending.append((part, table))
            self._publish_pending_calls(raise_errors=False)

    def _publish_pending_calls(self, raise_errors: bool) -> None:
        with self._lock:
            pending, self._calls_pending = self._calls_pending, []
        failed, first = [], None
        for part, table in pending:
            try:
                publish_calls(self.store, part, table, compression=self.compression,
                              redact=self.redactor.table if self.redactor is not None else None)
            except OSError as e:
                failed.append((part, table))
                first = first or e
                log.warning("call-log file of %s (%d calls) not published: %s; the next flush retries it",
                            "/".join(part), table.num_rows, _describe(e, self.store.staging_dir))
                continue
            with self._lock:
                self.stats["calls_logged"] += table.num_rows
        with self._lock:
            self._calls_pending[:0] = failed
        if failed and raise_errors:
            raise WriteError(f"{sum(t.num_rows for _, t in failed)} tool calls of published trajectories could not be "
                             f"written to the call log in {self.store.url}: {_describe(first, self.store.staging_dir)}; "
                             "they wait in the writer, so fix the cause and flush again")

    def close(self) -> None:
        """Flush, then stop the encoder threads (a later write starts them again)."""
        try:
            self.flush()
        finally:
            if self._pools is not None and not self._files:
                for pool in self._pools:
                    pool.shutdown(wait=True)
                self._pools = None

    def __enter__(self) -> "TrajectoryWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _describe(e: OSError, tmp: Path) -> str:
    if e.errno == errno.ENOSPC:
        return f"no space left on the device (ENOSPC) while writing {tmp}; free space or move data.root"
    name = errno.errorcode.get(e.errno or 0)
    return f"{e.strerror or e} ({name})" if name else str(e)


def check_parquet(path: Path, num_rows: int | None = None) -> None:
    """Raise OSError unless `path` has a readable Parquet footer with the file schema (and `num_rows`)."""
    try:
        with pq.ParquetFile(path) as pf:
            meta = pf.metadata
            schema = meta.schema.to_arrow_schema()
    except Exception as e:
        raise OSError(errno.EIO, f"{path} has no valid Parquet footer: {e}") from e
    if num_rows is not None and meta.num_rows != num_rows:
        raise OSError(errno.EIO, f"{path} holds {meta.num_rows} rows, expected {num_rows}")
    if schema.names != FILE_SCHEMA.names:
        raise OSError(errno.EIO, f"{path} columns {schema.names} differ from the file schema")


def read_records(store: TrajectoryStore, filter: Any = None) -> list[TrajectoryRecord]:
    """Every stored trajectory (matching the pyarrow compute `filter`) as records."""
    return [TrajectoryRecord.from_row(row) for row in store.read_table(filter).to_pylist()]


def find_trajectory(store: TrajectoryStore, trajectory_id: str) -> TrajectoryRecord | None:
    records = read_records(store, pc.field("trajectory_id") == trajectory_id)
    return records[0] if records else None


def open_writer(data_config: Any, store: TrajectoryStore | None = None) -> TrajectoryWriter:
    """The writer the config describes: its store, rows per file, codec, redaction of the configured
    field names, quarantine under `<data.root>/_quarantine`, and the call log."""
    from agentrl_cli.runtime.data.stores import open_store

    return TrajectoryWriter(store or open_store(data_config), rows_per_file=data_config.rows_per_file,
                            compression=data_config.compression, redactor=Redactor.from_config(data_config),
                            quarantine_dir=Path(data_config.root) / "_quarantine",
                            write_timeout_s=data_config.write_timeout_s, call_log=True)
