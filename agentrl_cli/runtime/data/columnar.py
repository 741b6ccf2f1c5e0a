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
import gc
import threading
from contextlib import contextmanager
from operator import attrgetter, itemgetter

import numpy as np
import pyarrow as pa

from agentrl_cli.core.outcomes import Outcome, RewardStatus, Termination
from agentrl_cli.runtime.data.schema import (ARTIFACT, FILE_SCHEMA, NUMERIC_LISTS, STEP, TOOL_CALL,
                                     TrajectoryRecord, _numeric_column)

_NESTED = {"steps", "artifacts", "reward_components", "flags", "env_resources", *NUMERIC_LISTS}
_SCALARS = [(f.name, f.type) for f in FILE_SCHEMA if f.name not in _NESTED]
_KINDS = {"string": (str, Outcome, RewardStatus, Termination), "bool": (bool,), "double": (int, float), "float": (int, float),
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


# The fast path: the tuple of the fields' Python types (one C-level `map(type, ...)`) decides the type
# check once per distinct signature (records of one run share a handful); a known-good signature
# leaves only the integer range and timezone checks. A record that fails walks the rules for the messages.
_NONE = type(None)
_SIGNATURES: dict[tuple, tuple | None] = {}
_MAX_SIGNATURES = 4096


def _picker(positions: list[int]):
    """A function of the values tuple giving the values at `positions` as a tuple (or None if none)."""
    if not positions:
        return None
    get = itemgetter(*positions)
    return get if len(positions) > 1 else (lambda values: (get(values),))


def _plan(signature: tuple) -> tuple | None:
    """None when a type is wrong; else (pickers of int values per bounds, picker of datetimes)."""
    by_bounds: dict[tuple, list[int]] = {}
    times = []
    for i, ((_name, _typ, kinds, bounds), t) in enumerate(zip(_RULES, signature)):
        if t is _NONE:
            continue
        if t not in kinds:
            return None
        if t is int and bounds is not None:
            by_bounds.setdefault(bounds, []).append(i)
        elif t is dt.datetime:
            times.append(i)
    return [(bounds, _picker(pos)) for bounds, pos in by_bounds.items()], _picker(times)


def _scalars_ok(record: TrajectoryRecord) -> bool:
    values = _GET(record)
    signature = tuple(map(type, values))
    plan = _SIGNATURES.get(signature, False)
    if plan is False:
        plan = _plan(signature)
        if len(_SIGNATURES) < _MAX_SIGNATURES:
            _SIGNATURES[signature] = plan
    if plan is None:
        return False
    ranges, times = plan
    for (lo, hi), pick in ranges:
        ints = pick(values)
        if min(ints) < lo or max(ints) >= hi:
            return False
    return times is None or all(t.tzinfo is not None for t in times(values))


def check_scalars(record: TrajectoryRecord) -> list[str]:
    """Type errors in the record's top-level scalar fields (and the harness partition value)."""
    if _scalars_ok(record):
        return []
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


_POSIX = dt.datetime.timestamp
_TZINFO = attrgetter("tzinfo")
_EXACT_S = 4e9  # |POSIX seconds| below which a float64 still holds every microsecond exactly (years 1843-2096)


def _timestamps(values, typ: pa.TimestampType) -> pa.Array:
    """Aware datetimes as a timestamp[ms] array via their POSIX timestamps: about half the time of
    Arrow's per-object conversion, and the same values (floored to the millisecond, as Arrow does).
    A naive datetime raises TypeError (the schema wants aware ones; Arrow would take it as UTC);
    None, another type or a far-off date go through Arrow itself."""
    try:
        seconds = np.fromiter(map(_POSIX, values), dtype=np.float64, count=len(values))
    except TypeError:
        return pa.array(values, type=typ)
    if None in map(_TZINFO, values):
        raise TypeError("a naive datetime where the schema wants a timezone-aware one")
    if len(seconds) and np.abs(seconds).max() >= _EXACT_S:
        return pa.array(values, type=typ)
    return pa.array(np.floor_divide(np.rint(seconds * 1e6).astype(np.int64), 1000), type=typ)


def _array(values, typ: pa.DataType) -> pa.Array:
    return _timestamps(values, typ) if pa.types.is_timestamp(typ) and typ.unit == "ms" else pa.array(values, type=typ)


def _columns(objs: list, typ: pa.StructType, skip: tuple[str, ...] = ()) -> dict[str, pa.Array]:
    """One Arrow array per struct field from objects' attributes (a C-level transpose)."""
    names = [typ.field(i).name for i in range(typ.num_fields) if typ.field(i).name not in skip]
    if len(names) == 1:
        values = [[getattr(o, names[0]) for o in objs]]
    else:
        values = list(zip(*map(attrgetter(*names), objs))) if objs else [()] * len(names)
    return {n: _array(v, typ.field(n).type) for n, v in zip(names, values)}


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


_gc_lock = threading.Lock()
_gc_state = {"depth": 0, "was_enabled": False}


@contextmanager
def _gc_paused():
    """The cyclic GC paused while a table is built: the build allocates tens of thousands of tuples
    and lists, each allocation burst triggering collections that walk every live record (a third of
    the build time, measured). Nested and thread-safe; the previous state comes back at the end."""
    with _gc_lock:
        if _gc_state["depth"] == 0:
            _gc_state["was_enabled"] = gc.isenabled()
            gc.disable()
        _gc_state["depth"] += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_state["depth"] -= 1
            if _gc_state["depth"] == 0 and _gc_state["was_enabled"]:
                gc.enable()


def records_table(records: list[TrajectoryRecord]) -> pa.Table:
    """The file-schema table of `records` (partition columns dropped). Raises pa.ArrowInvalid,
    pa.ArrowTypeError, TypeError or OverflowError when a value has the wrong type."""
    with _gc_paused():
        return _records_table(records)


def _records_table(records: list[TrajectoryRecord]) -> pa.Table:
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
        elif name == "env_resources":
            columns[name] = pa.array([r.env_resources for r in records], type=f.type)
    scalars = [(f.name, f.type) for f in FILE_SCHEMA if f.name not in _NESTED]
    values = zip(*map(attrgetter(*[n for n, _ in scalars]), records)) if records else [()] * len(scalars)
    for (name, typ), column in zip(scalars, values):
        columns[name] = _array(column, typ)
    return pa.Table.from_pydict({f.name: columns[f.name] for f in FILE_SCHEMA}, schema=FILE_SCHEMA)
