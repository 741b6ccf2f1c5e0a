"""The call log: every tool call of every stored trajectory, one Parquet row per call, beside the
trajectories in the same store and partitions (`calls/harness=H/date=D/part-<id>.parquet`).

Rows are taken from the trajectory records the writer publishes (`TrajectoryWriter(call_log=True)`,
which `open_writer`, the rollout's writer, turns on), so every harness's calls are logged by the
rollout and none by the harness. A row holds the run, trajectory, task, phase, the episode step and
the call's place in it, the tool's name, its arguments (JSON text), status, latency, retries, exit
code (null: none), output (clipped as the trajectory stores it: `data.max_tool_output_bytes`), the
whole output's size and sha256, and when its step started. Rows are sorted by run, trajectory, step
and call, and every scalar column has Parquet statistics, so filters on them skip row groups.

Belongs here: the call-log schema, its rows from records, writing one call-log file (the store's own
`publish`, create-only), reading it back with filters pushed down (`read_calls`) and the filter of
`agentrl data calls`. Not here: the trajectory schema (`schema.py`) or when files are written (`writer.py`).
"""

from __future__ import annotations

import io
import os
import tempfile
import uuid
from pathlib import Path
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from agentrl_cli.runtime.data.schema import PARTITIONING, TS, TrajectoryRecord

CALLS_PREFIX = "calls"
CALL_SCHEMA_VERSION = 1
CALL_FILE_SCHEMA = pa.schema([
    ("schema_version", pa.int32()),
    ("run_id", pa.string()),
    ("trajectory_id", pa.string()),
    ("task_id", pa.string()),
    ("phase", pa.string()),
    ("step", pa.int32()),            # the episode step (StepRecord.index)
    ("call", pa.int32()),            # the call's place among its step's calls
    ("tool", pa.string()),
    ("arguments", pa.string()),      # JSON text, as parsed from the model's turn
    ("status", pa.string()),
    ("latency_ms", pa.float64()),
    ("retries", pa.int32()),
    ("exit_code", pa.int32()),
    ("output", pa.string()),         # clipped to data.max_tool_output_bytes
    ("output_bytes", pa.int64()),    # the whole output's size (UTF-8)
    ("output_sha256", pa.string()),  # the whole output's digest
    ("started_at", TS),              # when the call's step started
], metadata={b"agentrl.call_schema_version": str(CALL_SCHEMA_VERSION).encode()})
CALL_SCHEMA = pa.unify_schemas([CALL_FILE_SCHEMA, PARTITIONING])  # a row as read: + harness, date
_STATS = [f.name for f in CALL_FILE_SCHEMA if f.name not in ("arguments", "output")]
_SORT = [("run_id", "ascending"), ("trajectory_id", "ascending"), ("step", "ascending"), ("call", "ascending")]


def _get(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


def call_rows(items: Iterable[TrajectoryRecord | dict]) -> list[dict]:
    """The call-log rows (file schema, partition columns left out) of trajectory records or rows."""
    rows = []
    for item in items:
        base = {"schema_version": CALL_SCHEMA_VERSION, "run_id": _get(item, "run_id"),
                "trajectory_id": _get(item, "trajectory_id"), "task_id": _get(item, "task_id"), "phase": _get(item, "phase")}
        for step in _get(item, "steps") or ():
            for i, call in enumerate(_get(step, "tool_calls") or ()):
                rows.append({**base, "step": _get(step, "index"), "call": i, "tool": _get(call, "name"),
                             **{k: _get(call, k) for k in ("arguments", "status", "latency_ms", "retries", "exit_code",
                                                          "output", "output_bytes", "output_sha256")},
                             "started_at": _get(step, "started_at")})
    return rows


def calls_table(items: Iterable[TrajectoryRecord | dict]) -> pa.Table:
    """`call_rows(items)` as a sorted Arrow table with the call-log file schema."""
    table = pa.Table.from_pylist(call_rows(items), schema=CALL_FILE_SCHEMA)
    return table.sort_by(_SORT) if table.num_rows else table


def publish_calls(store: Any, partition: tuple[str, str], table: pa.Table, *, compression: str | None = "zstd",
                  redact=None) -> str:
    """Write `table` (call-log file schema) as one Parquet file of `partition` (harness, date) in
    `store`: temp file in the store's staging directory, fsync, footer checked, then the store's
    create-only `publish`. `redact`: a table -> table function run before a byte is written.
    Returns the key. Raises OSError (the temp file removed) when any of it fails."""
    if redact is not None:
        table = redact(table)
    key = f"{CALLS_PREFIX}/harness={partition[0]}/date={partition[1]}/part-{uuid.uuid4().hex}.parquet"
    store.staging_dir.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix="calls-", suffix=".parquet.tmp", dir=store.staging_dir)
    os.close(fd)
    tmp = Path(name)
    try:
        pq.write_table(table, tmp, compression=compression or "none", write_statistics=_STATS,
                       row_group_size=64 * 1024)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        with pq.ParquetFile(tmp) as pf:
            if pf.metadata.num_rows != table.num_rows or pf.schema_arrow.names != CALL_FILE_SCHEMA.names:
                raise OSError(f"{tmp} does not read back as {table.num_rows} call-log rows")
        store.publish(tmp, key)
    finally:
        tmp.unlink(missing_ok=True)
    return key


def _partition(key: str) -> dict[str, str] | None:
    parts = key.split("/")
    if len(parts) != 4 or parts[0] != CALLS_PREFIX or not parts[3].endswith(".parquet"):
        return None
    found = dict(p.split("=", 1) for p in parts[1:3] if "=" in p)
    return found if set(found) == {"harness", "date"} else None


def _with_partition(table: pa.Table, key: str) -> pa.Table:
    part = _partition(key) or {}
    for f in PARTITIONING:
        table = table.append_column(f, pa.array([part.get(f.name)] * table.num_rows, f.type))
    return table


def read_calls(store: Any, filter: pc.Expression | None = None, columns: list[str] | None = None) -> pa.Table:
    """Every call-log row of `store` (with `harness` and `date`) for which `filter` holds, the
    filter pushed down to the Parquet row groups. A local store is read as one dataset; another
    (S3) file by file, its spooled files included. `columns`: only these (default all)."""
    columns = columns or CALL_SCHEMA.names
    keys = [info.key for info in store.list(CALLS_PREFIX + "/") if _partition(info.key)]
    root = getattr(store, "root", None)
    if isinstance(root, Path):
        if not keys:
            return CALL_SCHEMA.empty_table().select(columns)
        dataset = ds.dataset([str(root / k) for k in keys], schema=CALL_SCHEMA, format="parquet",
                             partition_base_dir=str(root / CALLS_PREFIX),
                             partitioning=ds.partitioning(PARTITIONING, flavor="hive"))
        return dataset.to_table(columns=columns, filter=filter)
    tables = [(k, store.get_bytes(k)) for k in keys]
    spool = getattr(store, "spool", None)
    if spool is not None:
        listed = set(keys)
        tables += [(i.key, spool.get_bytes(i.key)) for i in spool.list(CALLS_PREFIX + "/")
                   if _partition(i.key) and i.key not in listed]
    parts = [_with_partition(pq.read_table(io.BytesIO(data), schema=CALL_FILE_SCHEMA), k) for k, data in tables]
    table = pa.concat_tables(parts) if parts else CALL_SCHEMA.empty_table()
    table = table.filter(filter) if filter is not None else table
    return table.select(columns)


def calls_filter(*, run: str = "", trajectory: str = "", task: str = "", tool: str = "", status: str = "",
                 harness: str = "") -> pc.Expression | None:
    """The `agentrl data calls` options as one filter (equality on each given column; None: all)."""
    given = {"run_id": run, "trajectory_id": trajectory, "task_id": task, "tool": tool, "status": status,
             "harness": harness}
    out = None
    for column, value in given.items():
        if value:
            expr = pc.field(column) == value
            out = expr if out is None else out & expr
    return out
