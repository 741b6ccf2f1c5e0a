"""TrajectoryRecords to an Arrow table column by column: the writer's fast path.

Building per-row dicts and letting Arrow walk them costs more than encoding the file, so records
are turned into columns directly: one Python list per scalar column, the steps and their tool
calls flattened into child columns with list offsets, numeric columns (token ids, loss mask,
log-probs) concatenated as numpy arrays. Arrow's conversion refuses a value of the wrong type
(a string where an int belongs, a fractional float for an int), so a bad record surfaces here;
the writer then finds it with `schema.validate_row` and quarantines it. `check_scalars` is the cheap
check `write` runs on the top-level fields so most drift is refused at once.
"""

from __future__ import annotations

import datetime as dt
from operator import attrgetter

import numpy as np
import pyarrow as pa

from agentrl_cli.data.schema import (ARTIFACT, FILE_SCHEMA, NUMERIC_LISTS, STEP, TOOL_CALL,
                                     TrajectoryRecord, _numeric_column)

_NESTED = {"steps", "artifacts", "reward_components", "flags", *NUMERIC_LISTS}
_SCALARS = [(f.name, f.type) for f in FILE_SCHEMA if f.name not in _NESTED]
_KINDS = {"string": (str,), "bool": (bool,), "double": (int, float), "float": (int, float),
          "int8": (int,), "int16": (int,), "int32": (int,), "int64": (int,)}


_CHECKED = _SCALARS + [("harness", pa.string())]
_GET = attrgetter(*[name for name, _ in _CHECKED])
_RULES = []
for _name, _typ in _CHECKED:
    if pa.types.is_timestamp(_typ):
        _RULES.append((_name, _typ, (dt.datetime,), None))
    else:
        _bits = _typ.bit_width - 1 if pa.types.is_integer(_typ) else None
        _RULES.append((_name, _typ, _KINDS[str(_typ)], None if _bits is None else (-(1 << _bits), 1 << _bits)))


def check_scalars(record: TrajectoryRecord) -> list[str]:
    """Type errors in the record's top-level scalar fields (and the harness partition value)."""
    errors = []
    for (name, typ, kinds, bounds), v in zip(_RULES, _GET(record)):
        if v is None:
            continue
        t = type(v)
        if t in kinds and (bounds is None or t is not int or bounds[0] <= v < bounds[1]) and \
                (t is not dt.datetime or v.tzinfo is not None):
            continue
        errors.append(f"{name}: expected {typ}, got {t.__name__} {v!r:.60}")
    return errors


def _offsets(lengths: list[int]) -> pa.Array:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.array(offsets)


def _columns(objs: list, typ: pa.StructType, skip: tuple[str, ...] = ()) -> dict[str, pa.Array]:
    """One Arrow array per struct field from objects' attributes (a C-level transpose)."""
    names = [typ.field(i).name for i in range(typ.num_fields) if typ.field(i).name not in skip]
    if len(names) == 1:
        values = [[getattr(o, names[0]) for o in objs]]
    else:
        values = list(zip(*map(attrgetter(*names), objs))) if objs else [()] * len(names)
    return {n: pa.array(v, type=typ.field(n).type) for n, v in zip(names, values)}


def _struct(typ: pa.StructType, columns: dict[str, pa.Array]) -> pa.StructArray:
    return pa.StructArray.from_arrays([columns[typ.field(i).name] for i in range(typ.num_fields)], fields=list(typ))


def _steps_column(records: list[TrajectoryRecord]) -> pa.Array:
    steps = [s for r in records for s in r.steps]
    calls = [c for s in steps for c in s.tool_calls]
    tool_calls = pa.ListArray.from_arrays(_offsets([len(s.tool_calls) for s in steps]), _struct(TOOL_CALL, _columns(calls, TOOL_CALL)))
    cols = {"tool_calls": tool_calls, **_columns(steps, STEP, skip=("tool_calls",))}
    return pa.ListArray.from_arrays(_offsets([len(r.steps) for r in records]), _struct(STEP, cols))


def _artifacts_column(records: list[TrajectoryRecord]) -> pa.Array:
    arts = [a for r in records for a in r.artifacts]
    return pa.ListArray.from_arrays(_offsets([len(r.artifacts) for r in records]), _struct(ARTIFACT, _columns(arts, ARTIFACT)))


def records_table(records: list[TrajectoryRecord]) -> pa.Table:
    """The file-schema table of `records` (partition columns dropped). Raises pa.ArrowInvalid,
    pa.ArrowTypeError, TypeError or OverflowError when a value has the wrong type."""
    columns = {}
    for f in FILE_SCHEMA:
        name = f.name
        if name in NUMERIC_LISTS:
            columns[name] = _numeric_column([getattr(r, name) for r in records], name)
        elif name == "steps":
            columns[name] = _steps_column(records)
        elif name == "artifacts":
            columns[name] = _artifacts_column(records)
        elif name == "reward_components":
            columns[name] = pa.array([list(r.reward_components.items()) for r in records], type=f.type)
        elif name == "flags":
            columns[name] = pa.array([r.flags for r in records], type=f.type)
    scalars = [(f.name, f.type) for f in FILE_SCHEMA if f.name not in _NESTED]
    values = zip(*map(attrgetter(*[n for n, _ in scalars]), records)) if records else [()] * len(scalars)
    for (name, typ), column in zip(scalars, values):
        columns[name] = pa.array(column, type=typ)
    return pa.Table.from_pydict({f.name: columns[f.name] for f in FILE_SCHEMA}, schema=FILE_SCHEMA)
