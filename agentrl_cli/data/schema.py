"""The trajectory record (DESIGN §3): one explicit Arrow schema, one Parquet row per trajectory, and
the trainer's input. `TrajectoryRecord` is the typed Python side; `validate_row` checks a row
against the schema *before* anything is written (schema drift such as an int where a string
belongs is rejected by name, never coerced).

Partition columns (`harness`, `date`) live in the Hive path `harness=…/date=…`, not in the file;
`PARTITIONING` re-adds them on read. Writing, stores and queries belong in the other modules.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

SCHEMA_VERSION = 1
OUTCOMES = ("success", "partial", "fail", "truncated", "timeout", "error")
REWARD_STATUSES = ("ok", "fail", "timeout", "infra_error", "unscored")
PARTITION_COLUMNS = ("harness", "date")

TS = pa.timestamp("ms", tz="UTC")
TOOL_CALL = pa.struct([
    ("name", pa.string()), ("arguments", pa.string()),  # arguments as JSON text
    ("status", pa.string()), ("latency_ms", pa.float64()), ("retries", pa.int32()),
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
])
ARTIFACT = pa.struct([("path", pa.string()), ("sha256", pa.string()), ("content", pa.string())])

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
    ("token_ids", pa.list_(pa.int32())),
    ("loss_mask", pa.list_(pa.int8())),
    ("logprobs", pa.list_(pa.float32())),
    ("started_at", TS),
    ("ended_at", TS),
], metadata={b"agentrl.schema_version": str(SCHEMA_VERSION).encode()})
PARTITIONING = pa.schema([("harness", pa.string()), ("date", pa.string())])
SCHEMA = pa.unify_schemas([FILE_SCHEMA, PARTITIONING])  # the row as records carry it


def utcnow() -> dt.datetime:
    """Now in UTC at the stored (millisecond) precision, so records round-trip exactly."""
    now = dt.datetime.now(dt.timezone.utc)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


@dataclass
class ToolCallRecord:
    name: str
    arguments: str = "{}"
    status: str = "ok"
    latency_ms: float = 0.0
    retries: int = 0


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
    outcome: str = "fail"
    turns: int = 0
    tool_calls: int = 0
    tool_failures: int = 0
    invalid_actions: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    started_at: dt.datetime = field(default_factory=utcnow)
    ended_at: dt.datetime = field(default_factory=utcnow)
    trajectory_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, got {self.outcome!r}")
        if self.reward_status not in REWARD_STATUSES:
            raise ValueError(f"reward_status must be one of {REWARD_STATUSES}, got {self.reward_status!r}")

    @property
    def date(self) -> str:
        return self.started_at.astimezone(dt.timezone.utc).strftime("%Y-%m-%d")

    def to_row(self) -> dict:
        row = dataclasses.asdict(self)
        row["date"] = self.date
        row["reward_components"] = list(self.reward_components.items())
        return row

    @classmethod
    def from_row(cls, row: dict) -> "TrajectoryRecord":
        row = {k: v for k, v in row.items() if k != "date"}
        row["steps"] = [StepRecord(**{**s, "tool_calls": [ToolCallRecord(**c) for c in s["tool_calls"] or ()]})
                        for s in row.get("steps") or ()]
        row["artifacts"] = [Artifact(**a) for a in row.get("artifacts") or ()]
        comps = row.get("reward_components") or {}
        row["reward_components"] = dict(comps) if not isinstance(comps, dict) else comps
        for key in ("flags", "token_ids", "loss_mask", "logprobs"):
            row[key] = list(row.get(key) or ())
        return cls(**row)


# ---- validation ------------------------------------------------------------------------------

def _check(value: Any, typ: pa.DataType, path: str, errors: list[str], nullable: bool = True) -> None:
    if value is None:
        if not nullable:
            errors.append(f"{path}: null where {typ} is required")
        return
    if pa.types.is_string(typ):
        ok = isinstance(value, str)
    elif pa.types.is_boolean(typ):
        ok = isinstance(value, bool)
    elif pa.types.is_integer(typ):
        ok = isinstance(value, int) and not isinstance(value, bool)
        if ok:
            bits = typ.bit_width - 1
            ok = -(1 << bits) <= value < (1 << bits)
    elif pa.types.is_floating(typ):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif pa.types.is_timestamp(typ):
        ok = isinstance(value, dt.datetime) and value.tzinfo is not None
    elif pa.types.is_map(typ):
        items = value.items() if isinstance(value, dict) else value
        ok = isinstance(value, (dict, list))
        if ok:
            for i, item in enumerate(items):
                if not (isinstance(item, (tuple, list)) and len(item) == 2):
                    errors.append(f"{path}[{i}]: expected a (key, value) pair")
                    continue
                _check(item[0], typ.key_type, f"{path}.key", errors, nullable=False)
                _check(item[1], typ.item_type, f"{path}[{item[0]!r}]", errors)
            return
    elif pa.types.is_list(typ):
        ok = isinstance(value, (list, tuple))
        if ok:
            for i, item in enumerate(value):
                _check(item, typ.value_type, f"{path}[{i}]", errors)
            return
    elif pa.types.is_struct(typ):
        ok = isinstance(value, dict)
        if ok:
            names = {typ.field(i).name for i in range(typ.num_fields)}
            for extra in sorted(set(value) - names):
                errors.append(f"{path}.{extra}: not in the schema")
            for i in range(typ.num_fields):
                f = typ.field(i)
                _check(value.get(f.name), f.type, f"{path}.{f.name}", errors)
            return
    else:  # pragma: no cover - the schema uses only the types above
        ok = False
    if not ok:
        errors.append(f"{path}: expected {typ}, got {type(value).__name__} {value!r:.60}")


def validate_row(row: dict) -> list[str]:
    """Every way `row` departs from `SCHEMA` (empty when it conforms); never coerces."""
    errors: list[str] = []
    for extra in sorted(set(row) - set(SCHEMA.names)):
        errors.append(f"{extra}: not in the schema (schema_version {SCHEMA_VERSION})")
    required = {"schema_version", "run_id", "trajectory_id", "task_id", "harness", "date", "outcome"}
    for f in SCHEMA:
        _check(row.get(f.name), f.type, f.name, errors, nullable=f.name not in required)
    if row.get("schema_version") not in (None, SCHEMA_VERSION) and isinstance(row.get("schema_version"), int):
        errors.append(f"schema_version: {row['schema_version']} is not the supported version {SCHEMA_VERSION}")
    if isinstance(row.get("outcome"), str) and row["outcome"] not in OUTCOMES:
        errors.append(f"outcome: {row['outcome']!r} is not one of {OUTCOMES}")
    return errors


def to_table(rows: list[dict]) -> pa.Table:
    """Rows (already validated) as a table with the file schema (partition columns dropped)."""
    return pa.Table.from_pylist([{k: v for k, v in r.items() if k not in PARTITION_COLUMNS} for r in rows],
                                schema=FILE_SCHEMA)
