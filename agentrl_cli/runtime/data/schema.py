"""The trajectory record: one explicit Arrow schema, one Parquet row per trajectory, and
the trainer's input. `TrajectoryRecord` is the typed Python side; `validate_row` checks a row
against the schema *before* anything is written (schema drift such as an int where a string
belongs is rejected by name, never coerced).

Partition columns (`harness`, `date`) live in the Hive path `harness=…/date=…`, not in the file;
`PARTITIONING` re-adds them on read. The training arrays (`token_ids`, `loss_mask`, `logprobs`, and
`segment_starts`: where each training sample starts when an episode is several, as an agent that
rewrote its history is; empty = one sample) are stored as raw little-endian bytes of the dtype in each field's metadata; records hold them as
lists or numpy arrays, `decode_arrays` turns a column back into numpy arrays. Writing, stores and queries belong in the other modules.

Versions (READABLE_SCHEMA_VERSIONS): 2 added each tool call's `exit_code`, `output` (clipped to
`data.max_tool_output_bytes`), `output_bytes` and `output_sha256` (and the top-level `env_resources`).
Version 1 files are read with the dataset schema of version 2 (Arrow fills the missing fields with
nulls), so their records keep `schema_version` 1 and None in those fields; only version 2 rows are
written (tests/golden/trajectory_store_v1 is a store the version 1 writer wrote). 3 added `role` (the
role whose training sequence the row holds, in an episode of several roles; null = a single-agent
episode) and each step's `role` (the role that acted); files of versions 1 and 2 read with them null
(tests/golden/trajectory_store_v2 is a store the version 2 writer wrote). 4 added `image_digest` (the
manifest digest of the OCI image the episode's sandbox ran in; "" = the host's root filesystem);
files of versions 1 to 3 read with it null: not recorded then (tests/golden/trajectory_store_v3 is a
store the version 3 writer wrote).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
from agentrl_cli.core.outcomes import Outcome, RewardStatus, values

SCHEMA_VERSION = 4  # 2: tool calls carry exit_code, output (clipped), output_bytes, output_sha256; 3: role, steps' role; 4: image_digest
READABLE_SCHEMA_VERSIONS = (1, 2, 3, 4)  # older files read with the later fields null
OUTCOMES = values(Outcome)
REWARD_STATUSES = values(RewardStatus)
PARTITION_COLUMNS = ("harness", "date")

TS = pa.timestamp("ms", tz="UTC")
TOOL_CALL = pa.struct([
    ("name", pa.string()), ("arguments", pa.string()),  # arguments as JSON text
    ("status", pa.string()), ("latency_ms", pa.float64()), ("retries", pa.int32()),
    # schema 2: the command's exit status (null: the call has none); the output as the harness reported
    # it, clipped to data.max_tool_output_bytes of UTF-8; the full output's size and sha256 (all null
    # in version 1 files: not recorded then)
    ("exit_code", pa.int32()), ("output", pa.string()), ("output_bytes", pa.int64()), ("output_sha256", pa.string()),
])
STEP = pa.struct([
    ("index", pa.int32()),
    ("action", pa.string()),
    ("tool_calls", pa.list_(TOOL_CALL)),
    ("observation", pa.string()),
    ("observation_status", pa.string()),
    ("reward", pa.float64()),
    ("weight_version", pa.string()),
    ("started_at", TS), ("ended_at", TS),
    ("role", pa.string()),  # schema 3: the role that acted (multi-agent episodes; null otherwise)
])
ARTIFACT = pa.struct([("path", pa.string()), ("sha256", pa.string()), ("content", pa.string())])
# what the episode's sandbox used, read from its cgroups and /proc before it was destroyed
# (Sandbox.resources); null for episodes without a sandbox, or in files written before the column
ENV_RESOURCES = pa.struct([("cpu_s", pa.float64()), ("peak_memory_bytes", pa.int64()),
                           ("processes", pa.int32()), ("open_files", pa.int32())])

FILE_SCHEMA = pa.schema([
    ("schema_version", pa.int32()),
    ("run_id", pa.string()),
    ("trajectory_id", pa.string()),
    ("task_id", pa.string()),
    ("task_type", pa.string()),          # the task family, e.g. "arith"
    ("harness_version", pa.string()),
    ("task_set_version", pa.string()),
    ("split", pa.string()),
    ("phase", pa.string()),              # training phase: warmup, train, eval, ...
    ("group_id", pa.string()),           # GRPO group: samples of one task drawn together
    ("seed", pa.int64()),
    ("policy_version_first", pa.string()),
    ("policy_version_last", pa.string()),
    ("initial_observation", pa.string()),
    ("steps", pa.list_(STEP)),
    ("final_answer", pa.string()),
    ("artifacts", pa.list_(ARTIFACT)),
    ("reward", pa.float64()),
    ("reward_components", pa.map_(pa.string(), pa.float64())),
    ("reward_status", pa.string()),
    ("flags", pa.list_(pa.string())),    # e.g. "tamper", "quarantined_task"
    ("outcome", pa.string()),
    ("turns", pa.int32()),
    ("tool_calls", pa.int32()),
    ("tool_failures", pa.int32()),
    ("invalid_actions", pa.int32()),
    ("prompt_tokens", pa.int32()),
    ("completion_tokens", pa.int32()),
    # the training arrays: raw little-endian bytes of one numpy dtype each (field metadata "dtype"),
    # one value per row, so writing them costs a memcpy and zstd, not a per-token encode
    pa.field("token_ids", pa.binary(), metadata={b"dtype": b"<i4"}),
    pa.field("loss_mask", pa.binary(), metadata={b"dtype": b"|i1"}),
    pa.field("logprobs", pa.binary(), metadata={b"dtype": b"<f4"}),
    # where each training sample starts in token_ids when the episode is several (an agent that
    # rewrote its history): [0, n0, n0 + n1, ...]; empty (or null, in files written before it) = one
    pa.field("segment_starts", pa.binary(), metadata={b"dtype": b"<i4"}),
    ("started_at", TS),
    ("ended_at", TS),
    ("env_resources", ENV_RESOURCES),
    # schema 3: the role whose training sequence this row holds, in an episode of several roles (its
    # steps are the whole episode's, each with the role that acted); null: a single-agent episode
    ("role", pa.string()),
    # schema 4: the manifest digest ("sha256:…") of the OCI image the episode's sandbox ran in
    # (harnesses[].image); "": the host's root filesystem, or no sandbox; null: a file before schema 4
    ("image_digest", pa.string()),
], metadata={b"agentrl.schema_version": str(SCHEMA_VERSION).encode()})
PARTITIONING = pa.schema([("harness", pa.string()), ("date", pa.string())])
SCHEMA = pa.unify_schemas([FILE_SCHEMA, PARTITIONING])  # the row as records carry it


def utcnow() -> dt.datetime:
    """Now in UTC at the stored (millisecond) precision, so records round-trip exactly."""
    now = dt.datetime.now(dt.timezone.utc)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


@dataclass
class ToolCallRecord:
    """One tool call as stored. `arguments`: JSON text of the arguments as parsed; `output`: what the
    harness reported the call returned, clipped (`output_bytes` and `output_sha256` are of the whole
    output); None in those and `exit_code`: not known (a call without one, or a version 1 file)."""

    name: str
    arguments: str = "{}"
    status: str = "ok"
    latency_ms: float = 0.0
    retries: int = 0
    exit_code: int | None = None
    output: str | None = None
    output_bytes: int | None = None
    output_sha256: str | None = None


@dataclass
class StepRecord:
    index: int
    action: str
    observation: str
    observation_status: str = "ok"
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    reward: float = 0.0
    weight_version: str = ""
    started_at: dt.datetime = field(default_factory=utcnow)
    ended_at: dt.datetime = field(default_factory=utcnow)
    role: str | None = None  # the role that acted (multi-agent episodes); None: single-agent, or a file before schema 3


@dataclass
class Artifact:
    path: str
    sha256: str | None  # None: the file was missing
    content: str | None = None


@dataclass
class TrajectoryRecord:
    """One trajectory as stored and trained on. Field order and names follow `SCHEMA`."""

    run_id: str
    task_id: str
    harness: str
    harness_version: str
    task_type: str = ""
    task_set_version: str = ""
    split: str = "train"
    phase: str = "train"
    group_id: str = ""
    seed: int = 0
    policy_version_first: str = ""
    policy_version_last: str = ""
    initial_observation: str = ""
    steps: list[StepRecord] = field(default_factory=list)
    final_answer: str | None = None
    artifacts: list[Artifact] = field(default_factory=list)
    reward: float = 0.0
    reward_components: dict[str, float] = field(default_factory=dict)
    reward_status: str = "unscored"
    flags: list[str] = field(default_factory=list)
    outcome: str = Outcome.FAIL
    turns: int = 0
    tool_calls: int = 0
    tool_failures: int = 0
    invalid_actions: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    segment_starts: list[int] = field(default_factory=list)  # see FILE_SCHEMA; [] = one training sample
    started_at: dt.datetime = field(default_factory=utcnow)
    ended_at: dt.datetime = field(default_factory=utcnow)
    trajectory_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    schema_version: int = SCHEMA_VERSION
    env_resources: dict | None = None  # ENV_RESOURCES: cpu_s, peak_memory_bytes, processes, open_files
    role: str | None = None  # the role whose training sequence this is (multi-agent); None: single-agent
    image_digest: str | None = ""  # the sandbox image's manifest digest; "": host root; None: a file before schema 4

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, got {self.outcome!r}")
        if self.reward_status not in REWARD_STATUSES:
            raise ValueError(f"reward_status must be one of {REWARD_STATUSES}, got {self.reward_status!r}")

    @property
    def date(self) -> str:
        return self.started_at.astimezone(dt.timezone.utc).date().isoformat()

    def to_row(self) -> dict:
        """The row as the writer takes it: plain values, steps and artifacts as dicts; numeric
        columns (token_ids, loss_mask, logprobs) passed through as given (lists or numpy arrays)."""
        row = {f.name: getattr(self, f.name) for f in _FIELDS}
        row["steps"] = [{**s.__dict__, "tool_calls": [c.__dict__.copy() for c in s.tool_calls]} for s in self.steps]
        row["artifacts"] = [a.__dict__.copy() for a in self.artifacts]
        row["reward_components"] = list(self.reward_components.items())
        row["flags"] = list(self.flags)
        ok_time = isinstance(self.started_at, dt.datetime) and self.started_at.tzinfo is not None
        row["date"] = self.date if ok_time else None
        return row

    @classmethod
    def from_row(cls, row: dict) -> "TrajectoryRecord":
        row = {k: v for k, v in row.items() if k != "date"}
        row["steps"] = [StepRecord(**{**s, "tool_calls": [ToolCallRecord(**c) for c in s.get("tool_calls") or ()]})
                        for s in row.get("steps") or ()]
        row["artifacts"] = [Artifact(**a) for a in row.get("artifacts") or ()]
        comps = row.get("reward_components") or {}
        row["reward_components"] = dict(comps) if not isinstance(comps, dict) else comps
        row["flags"] = list(row.get("flags") or ())
        for key, dtype in NUMERIC_LISTS.items():
            value = row.get(key)
            if isinstance(value, (bytes, bytearray, memoryview)):
                row[key] = np.frombuffer(value, dtype=dtype).tolist()
            else:
                row[key] = [] if value is None else (value if isinstance(value, np.ndarray) else list(value))
        return cls(**row)


_FIELDS = dataclasses.fields(TrajectoryRecord)
NUMERIC_LISTS = {"token_ids": np.dtype("<i4"), "loss_mask": np.dtype("|i1"), "logprobs": np.dtype("<f4"),
                 "segment_starts": np.dtype("<i4")}


def as_array(value, dtype: np.dtype, name: str = "array") -> np.ndarray:
    """`value` (numpy array or list of numbers) as a 1-d array of `dtype`, refusing what would change
    a value: strings, fractional numbers for an integer dtype, integers outside its range."""
    if type(value) is np.ndarray and value.dtype == dtype and value.ndim == 1:
        return value  # the rollout's own arrays: nothing to check or convert
    arr = value if isinstance(value, np.ndarray) else np.asarray(list(value))
    if arr.size == 0:
        return np.zeros(0, dtype=dtype)
    allowed = "iub" if dtype.kind == "i" else "iubf"
    if arr.ndim != 1 or arr.dtype.kind not in allowed:
        raise TypeError(f"{name}: expected numbers for {dtype.name}, got {arr.dtype} with shape {arr.shape}")
    if dtype.kind == "i" and arr.dtype != dtype:
        info = np.iinfo(dtype)
        if arr.min() < info.min or arr.max() > info.max:
            raise OverflowError(f"{name}: values outside {dtype.name} (min {arr.min()}, max {arr.max()})")
    return arr.astype(dtype, copy=False)


def decode_arrays(column: pa.ChunkedArray | pa.Array, name: str) -> list[np.ndarray]:
    """A stored training-array column back as numpy arrays (zero-copy views, read-only)."""
    dtype = NUMERIC_LISTS[name]
    return [np.frombuffer(b, dtype=dtype) if b is not None else np.zeros(0, dtype=dtype) for b in
            (v.as_buffer() if v.is_valid else None for v in column)]


# ---- validation ------------------------------------------------------------------------------
# A checker per Arrow type, built once: `check(value, path, errors)`. The training arrays accept a
# numpy array (checked by dtype and range, the rollout's form) or a list of numbers.

def _scalar(ok, typ):
    def check(value, path, errors):
        if value is not None and not ok(value):
            errors.append(f"{path}: expected {typ}, got {type(value).__name__} {value!r:.60}")
    return check


def _int_ok(bits: int):
    lo, hi = -(1 << (bits - 1)), 1 << (bits - 1)
    return lambda v: type(v) is int and lo <= v < hi


_INTS = (int,)
_PY_TYPES = {pa.string(): (str,), pa.bool_(): (bool,), pa.float64(): (int, float), pa.float32(): (int, float),
             pa.int8(): _INTS, pa.int16(): _INTS, pa.int32(): _INTS, pa.int64(): _INTS, TS: (dt.datetime,)}


def _checker(typ: pa.DataType):
    if pa.types.is_string(typ):
        return _scalar(lambda v: isinstance(v, str), typ)
    if pa.types.is_boolean(typ):
        return _scalar(lambda v: type(v) is bool, typ)
    if pa.types.is_integer(typ):
        return _scalar(_int_ok(typ.bit_width), typ)
    if pa.types.is_floating(typ):
        return _scalar(lambda v: type(v) in (int, float), typ)
    if pa.types.is_timestamp(typ):
        return _scalar(lambda v: isinstance(v, dt.datetime) and v.tzinfo is not None, typ)
    if pa.types.is_map(typ):
        key, item = _checker(typ.key_type), _checker(typ.item_type)

        def check_map(value, path, errors):
            if value is None:
                return
            if not isinstance(value, (dict, list)):
                errors.append(f"{path}: expected {typ}, got {type(value).__name__}")
                return
            for i, pair in enumerate(value.items() if isinstance(value, dict) else value):
                if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
                    errors.append(f"{path}[{i}]: expected a (key, value) pair")
                    continue
                if pair[0] is None:
                    errors.append(f"{path}.key: null where {typ.key_type} is required")
                key(pair[0], f"{path}.key", errors)
                item(pair[1], f"{path}[{pair[0]!r}]", errors)
        return check_map
    if pa.types.is_list(typ):
        inner = _checker(typ.value_type)

        def check_list(value, path, errors):
            if value is None:
                return
            if not isinstance(value, (list, tuple)):
                errors.append(f"{path}: expected {typ}, got {type(value).__name__} {value!r:.60}")
                return
            for i, v in enumerate(value):
                inner(v, f"{path}[{i}]", errors)
        return check_list
    if pa.types.is_struct(typ):
        # scalar fields checked inline (no call per value): structs are most of a row (steps); a value
        # that looks wrong goes to the field's own checker, which words the error
        scalars, nested = [], []
        for i in range(typ.num_fields):
            f = typ.field(i)
            if f.type in _PY_TYPES:
                bits = f.type.bit_width - 1 if pa.types.is_integer(f.type) else 63
                scalars.append((f.name, _PY_TYPES[f.type], -(1 << bits), 1 << bits, _checker(f.type)))
            else:
                nested.append((f.name, _checker(f.type)))
        names = {typ.field(i).name for i in range(typ.num_fields)}

        def check_struct(value, path, errors):
            if value is None:
                return
            if not isinstance(value, dict):
                errors.append(f"{path}: expected {typ}, got {type(value).__name__} {value!r:.60}")
                return
            if not names.issuperset(value):
                for extra in sorted(set(value) - names):
                    errors.append(f"{path}.{extra}: not in the schema")
            for name, kinds, lo, hi, check in scalars:
                v = value.get(name)
                if v is None:
                    continue
                t = type(v)
                if t not in kinds or (t is int and not lo <= v < hi) or (t is dt.datetime and v.tzinfo is None):
                    check(v, f"{path}.{name}", errors)
            for name, check in nested:
                check(value.get(name), f"{path}.{name}", errors)
        return check_struct
    raise TypeError(f"no checker for {typ}")  # pragma: no cover - the schema uses only the types above


def _array_checker(name: str):
    dtype = NUMERIC_LISTS[name]

    def check_array(value, path, errors):
        if value is None:
            return
        if not isinstance(value, (np.ndarray, list, tuple)):
            errors.append(f"{path}: expected a list or numpy array of {dtype.name}, got {type(value).__name__} {value!r:.60}")
            return
        if isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                if type(v) is not int and (dtype.kind == "i" or type(v) is not float):
                    errors.append(f"{path}[{i}]: expected {dtype.name}, got {type(v).__name__} {v!r:.60}")
                    return
        try:
            as_array(value, dtype, path)
        except (TypeError, OverflowError, ValueError) as exc:
            errors.append(str(exc))
    return check_array


REQUIRED = ("schema_version", "run_id", "trajectory_id", "task_id", "harness", "date", "outcome")
_CHECKS = [(f.name, _array_checker(f.name) if f.name in NUMERIC_LISTS else _checker(f.type)) for f in SCHEMA]


def validate_row(row: dict) -> list[str]:
    """Every way `row` departs from `SCHEMA` (empty when it conforms); never coerces."""
    errors: list[str] = []
    for extra in sorted(set(row) - set(SCHEMA.names)):
        errors.append(f"{extra}: not in the schema (schema_version {SCHEMA_VERSION})")
    for name in REQUIRED:
        if row.get(name) is None:
            errors.append(f"{name}: null where a value is required")
    for name, check in _CHECKS:
        check(row.get(name), name, errors)
    version = row.get("schema_version")
    if type(version) is int and version != SCHEMA_VERSION:
        errors.append(f"schema_version: {version} is not the supported version {SCHEMA_VERSION}")
    if isinstance(row.get("outcome"), str) and row["outcome"] not in OUTCOMES:
        errors.append(f"outcome: {row['outcome']!r} is not one of {OUTCOMES}")
    return errors


def _numeric_column(values: list, name: str) -> pa.Array:
    """A training-array column: each row's values as raw bytes of the column's dtype, laid out as
    one concatenated buffer plus offsets (no per-row bytes objects)."""
    dtype = NUMERIC_LISTS[name]
    arrays = [None if v is None else as_array(v, dtype, name) for v in values]
    offsets = np.zeros(len(arrays) + 1, dtype=np.int32)
    np.cumsum([0 if a is None else a.nbytes for a in arrays], out=offsets[1:])
    data = np.concatenate([a.view(np.uint8) for a in arrays if a is not None] or [np.zeros(0, np.uint8)])
    validity = None
    if any(a is None for a in arrays):
        validity = pa.array([a is not None for a in arrays]).buffers()[1]
    return pa.Array.from_buffers(pa.binary(), len(arrays), [validity, pa.py_buffer(offsets), pa.py_buffer(data)])


def to_table(rows: list[dict]) -> pa.Table:
    """Rows (already validated) as a table with the file schema (partition columns dropped)."""
    columns = {}
    plain = [{k: v for k, v in r.items() if k not in PARTITION_COLUMNS and k not in NUMERIC_LISTS} for r in rows]
    rest = pa.Table.from_pylist(plain, schema=pa.schema([f for f in FILE_SCHEMA if f.name not in NUMERIC_LISTS]))
    for f in FILE_SCHEMA:
        if f.name in NUMERIC_LISTS:
            columns[f.name] = _numeric_column([r.get(f.name) for r in rows], f.name)
        else:
            columns[f.name] = rest.column(f.name)
    return pa.Table.from_pydict(columns, schema=FILE_SCHEMA)


def to_full_table(rows: list[dict]) -> pa.Table:
    """Rows as a table with the full `SCHEMA`: the file columns plus the partition columns."""
    table = to_table(rows)
    for name in PARTITION_COLUMNS:
        table = table.append_column(name, pa.array([r.get(name) for r in rows], type=pa.string()))
    return table
