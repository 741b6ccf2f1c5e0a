"""Evaluation metrics computed from stored trajectories, grouped by harness, task
type and training phase. Reading the store and rendering tables belong elsewhere; `METRICS` tells a
renderer each metric's label and kind.

Definitions, over the trajectories of one group (n = their count):

    effectiveness
      success_rate               share with outcome "success"
      partial_rate               share with outcome "partial"
      mean_reward                mean of `reward`
    efficiency
      mean_turns                 mean of `turns`
      mean_tool_calls            mean of `tool_calls`
    stability
      tool_failure_rate          sum(tool_failures) / sum(tool_calls); None when sum(tool_calls) == 0
      timeout_rate               share with outcome "timeout"
      abnormal_termination_rate  share with outcome "error"
      truncated_rate             share with outcome "truncated" (a step-limit cut, not abnormal)
      infra_error_rate           share with reward_status "infra_error"
    behaviour
      invalid_action_ratio       sum(invalid_actions) / sum(turns); None when sum(turns) == 0
      repeated_action_ratio      (steps whose action, whitespace-normalised, equals an earlier step's
                                 action in the same trajectory) / sum(turns); None when
                                 sum(turns) == 0 or the table has no `steps` column

Means skip null values (None when all are null). Shares count a null outcome or reward_status as
"not that value". Besides one row per group, `compute_metrics` adds an overall row whose group
keys are all "all".
"""

from __future__ import annotations

from typing import Iterable, NamedTuple, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from agentrl_cli.core.outcomes import Outcome, RewardStatus
from agentrl_cli.runtime.data import schema
from agentrl_cli.core.errors import UsageError

GROUP_KEYS = ("harness", "task_type", "phase")
ALL = "all"


class Metric(NamedTuple):
    key: str
    label: str
    kind: str  # "rate" | "mean" | "count"


METRICS: list[Metric] = [
    Metric("n", "Trajectories", "count"),
    Metric("success_rate", "Success rate", "rate"),
    Metric("partial_rate", "Partial completion rate", "rate"),
    Metric("mean_reward", "Mean reward", "mean"),
    Metric("mean_turns", "Mean turns", "mean"),
    Metric("mean_tool_calls", "Mean tool calls", "mean"),
    Metric("tool_failure_rate", "Tool-call failure rate", "rate"),
    Metric("timeout_rate", "Timeout rate", "rate"),
    Metric("abnormal_termination_rate", "Abnormal termination rate", "rate"),
    Metric("truncated_rate", "Truncated (step limit) rate", "rate"),
    Metric("infra_error_rate", "Reward infra-error rate", "rate"),
    Metric("invalid_action_ratio", "Invalid-action ratio", "rate"),
    Metric("repeated_action_ratio", "Repeated-action ratio", "rate"),
]

_SHARES = {  # metric key -> (column, value) counted as a share of n
    "success_rate": ("outcome", Outcome.SUCCESS),
    "partial_rate": ("outcome", Outcome.PARTIAL),
    "timeout_rate": ("outcome", Outcome.TIMEOUT),
    "abnormal_termination_rate": ("outcome", Outcome.ERROR),
    "truncated_rate": ("outcome", Outcome.TRUNCATED),
    "infra_error_rate": ("reward_status", RewardStatus.INFRA_ERROR),
}
_MEANS = {"mean_reward": "reward", "mean_turns": "turns", "mean_tool_calls": "tool_calls"}
_SUMS = ("turns", "tool_calls", "tool_failures", "invalid_actions", "repeats")
_NEEDED = ("outcome", "reward_status", "reward", "turns", "tool_calls", "tool_failures", "invalid_actions")


class MetricsError(UsageError, ValueError):
    """The table cannot be summarised as asked (unknown group key, missing column)."""


def compute_metrics(table: pa.Table, group_by: Sequence[str] = GROUP_KEYS) -> list[dict]:
    """One dict per group (the `group_by` keys, n and every metric in `METRICS`), sorted by key,
    then the overall row with every group key set to "all"."""
    group_by = tuple(group_by)
    bad = [k for k in group_by if k not in GROUP_KEYS]
    if bad:
        raise MetricsError(f"cannot group metrics by {bad[0]!r}; the group keys are {', '.join(GROUP_KEYS)}",
                           hint=f"group by any of {', '.join(GROUP_KEYS)}, or by none for one overall row")
    missing = [c for c in (*_NEEDED, *group_by) if c not in table.column_names]
    if missing:
        raise MetricsError(f"the trajectory table lacks column(s) {', '.join(missing)}",
                           hint="read whole trajectory rows (with partition columns) before computing metrics")
    work = _per_trajectory(table, group_by)
    rows = []
    if group_by:
        grouped = _aggregate(work, list(group_by))
        rows = sorted(grouped, key=lambda r: tuple((r[k] is None, r[k] or "") for k in group_by))
    overall = _aggregate(work, [])
    rows.append({**{k: ALL for k in group_by}, **(overall[0] if overall else _metrics({}))})
    return rows


def metrics_from_records(records: Iterable[schema.TrajectoryRecord],
                         group_by: Sequence[str] = GROUP_KEYS) -> list[dict]:
    """`compute_metrics` over in-memory records (e.g. a run that has not been written yet)."""
    return compute_metrics(schema.to_full_table([r.to_row() for r in records]), group_by)


def _per_trajectory(table: pa.Table, group_by: tuple[str, ...]) -> pa.Table:
    """The columns the aggregation needs, one row per trajectory: group keys, the summed and
    averaged columns, one 0/1 column per share, and `repeats` (null without a steps column)."""
    cols = {k: table.column(k) for k in group_by}
    for key, (column, value) in _SHARES.items():
        hit = pc.fill_null(pc.equal(table.column(column), value), False)
        cols[f"hit_{key}"] = pc.cast(hit, pa.int64())
    for column in ("reward", "turns", "tool_calls", "tool_failures", "invalid_actions"):
        cols[column] = table.column(column)
    cols["repeats"] = (_repeats(table.column("steps")) if "steps" in table.column_names
                       else pa.nulls(table.num_rows, pa.int64()))
    return pa.table(cols)


def _repeats(steps: pa.ChunkedArray) -> pa.Array:
    """Per trajectory, how many steps repeat (whitespace-normalised) an earlier step's action."""
    counts = [0] * len(steps)
    base = 0
    for chunk in steps.chunks:
        parents = pc.list_parent_indices(chunk).to_pylist()
        actions = pc.struct_field(pc.list_flatten(chunk), "action").to_pylist()
        seen: dict[int, set[str]] = {}
        for parent, action in zip(parents, actions):
            if action is None:
                continue
            norm = " ".join(action.split())
            earlier = seen.setdefault(parent, set())
            if norm in earlier:
                counts[base + parent] += 1
            earlier.add(norm)
        base += len(chunk)
    return pa.array(counts, pa.int64())


def _aggregate(work: pa.Table, keys: list[str]) -> list[dict]:
    """One metrics dict per distinct value of `keys` in `work` (see `_per_trajectory`)."""
    if work.num_rows == 0:
        return []
    specs = [(f"hit_{k}", "sum") for k in _SHARES] + [(c, "sum") for c in _SUMS]
    specs += [(c, "mean") for c in _MEANS.values()]
    specs += [("hit_success_rate", "count", pc.CountOptions(mode="all"))]
    out = work.group_by(keys, use_threads=False).aggregate(specs)
    return [{**{k: agg[k] for k in keys}, **_metrics(agg)} for agg in out.to_pylist()]


def _metrics(agg: dict) -> dict:
    """The metrics in `METRICS` order from one group's sums, means and count."""
    n = agg.get("hit_success_rate_count", 0)

    def ratio(num: str, den: str) -> float | None:
        num_v, den_v = agg.get(f"{num}_sum"), agg.get(f"{den}_sum")
        return None if not den_v or num_v is None else num_v / den_v

    row: dict = {"n": n}
    for key in _SHARES:
        row[key] = agg[f"hit_{key}_sum"] / n if n else None
    for key, column in _MEANS.items():
        row[key] = agg.get(f"{column}_mean")
    row["tool_failure_rate"] = ratio("tool_failures", "tool_calls")
    row["invalid_action_ratio"] = ratio("invalid_actions", "turns")
    row["repeated_action_ratio"] = ratio("repeats", "turns")
    return {m.key: row[m.key] for m in METRICS}
