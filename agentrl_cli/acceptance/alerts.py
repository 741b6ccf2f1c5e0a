"""The run's alert rules, defined once: each rule renders to a Prometheus alerting rule (`agentrl
observe alerts`) and evaluates itself on a run's metrics.jsonl rows (`agentrl troubleshoot --run`).

A rule is one or more `Condition`s joined with PromQL `and`; a condition is
`[sum by (run_id, <labels>) (] <function>(<metric>[<window>]) [* scale] [)] <op> <threshold>`, with
the metric named as the run's Prometheus endpoint exposes the row key (`prometheus.series`), and
the thresholds and window taken from `observe.alert_*` (the reward rule's maximum from
`reward.weights`). `Condition.promql` is the PromQL; `Condition.evaluate` computes the same thing
from rows, each row a sample at its `elapsed_s`, the window ending at the last row:

- `avg_over_time`, `max_over_time`, `min_over_time`: the mean, max, min of the samples in the window;
- `increase`: last minus first sample in the window, counting a drop as a counter reset (Prometheus
  also extrapolates to the window's edges; over rows this does not);
- `deriv`: the least-squares slope per second of the samples in the window (as Prometheus computes it).

What rows cannot show: a rule's `for:` duration (the rows are judged once, as they stand at the
end), and a series Prometheus keeps between scrapes (a key missing from a row is no sample here).
Belongs here: the rules and their evaluation; the detector that applies them is troubleshoot's.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import yaml

from agentrl_cli.runtime.observe import keys
from agentrl_cli.runtime.observe.prometheus import series

OPS = {">": operator.gt, ">=": operator.ge, "<=": operator.le, "<": operator.lt}
FUNCTIONS = ("avg_over_time", "max_over_time", "min_over_time", "increase", "deriv")
REWARD_STD_FLAT = 1e-6  # a reward std at or below this is "every episode scored the same"
PINNED_FRACTION = 0.999  # a mean reward at or above this share of the maximum is "at the maximum"


def number(x: float) -> str:
    """A threshold as PromQL writes it: shortest exact form."""
    x = round(float(x), 9)
    return repr(int(x)) if x.is_integer() else repr(x)


@dataclass(frozen=True)
class Condition:
    metric: str  # the Prometheus metric name (prometheus.series of the row key)
    function: str  # one of FUNCTIONS
    op: str  # one of OPS
    threshold: float
    by: tuple[str, ...] = ()  # sum by these labels (and run_id); () = no aggregation, one result per series
    scale: float = 1.0  # the function's value times this (deriv per second * 3600 = per hour)

    def promql(self, window_s: float) -> str:
        expr = f"{self.function}({self.metric}[{duration(window_s)}])"
        if self.scale != 1.0:
            expr = f"{expr} * {number(self.scale)}"
        if self.by:
            expr = f"sum by ({', '.join(('run_id', *self.by))}) ({expr})"
        return f"{expr} {self.op} {number(self.threshold)}"

    def values(self, rows: list[dict], window_s: float) -> dict[tuple, float]:
        """Per series (its labels, run_id aside), the left-hand side's value at the last row."""
        samples: dict[tuple, list[tuple[float, float]]] = {}
        times = [r[keys.ELAPSED_S] for r in rows if isinstance(r.get(keys.ELAPSED_S), (int, float))]
        if not times:
            return {}
        end = max(times)
        for row in rows:
            t = row.get(keys.ELAPSED_S)
            if not isinstance(t, (int, float)) or not end - window_s < t <= end:
                continue
            for key, value in row.items():
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                    continue
                named = series(key)
                if named is not None and named[0] == self.metric:
                    samples.setdefault(tuple(sorted(named[1].items())), []).append((float(t), float(value)))
        out: dict[tuple, float] = {}
        for labels, points in samples.items():
            v = _apply(self.function, sorted(points))
            if v is not None:
                out[labels] = v * self.scale
        if self.by:
            summed: dict[tuple, float] = {}
            for labels, v in out.items():
                group = tuple((k, x) for k, x in labels if k in self.by)
                summed[group] = summed.get(group, 0.0) + v
            out = summed
        return out

    def evaluate(self, rows: list[dict], window_s: float) -> dict[tuple, float]:
        """The series whose value satisfies the comparison (PromQL's filtering comparison), with their values."""
        return {labels: v for labels, v in self.values(rows, window_s).items() if OPS[self.op](v, self.threshold)}


def _apply(function: str, points: list[tuple[float, float]]) -> float | None:
    values = [v for _, v in points]
    if function == "avg_over_time":
        return sum(values) / len(values)
    if function == "max_over_time":
        return max(values)
    if function == "min_over_time":
        return min(values)
    if function == "increase":
        if len(values) < 2:
            return None
        return sum(b - a if b >= a else b for a, b in zip(values, values[1:]))  # a drop is a reset: count from 0
    if function == "deriv":
        if len(points) < 2:
            return None
        n = len(points)
        mt = sum(t for t, _ in points) / n
        mv = sum(values) / n
        var = sum((t - mt) ** 2 for t, _ in points)
        return None if var == 0 else sum((t - mt) * (v - mv) for t, v in points) / var
    raise ValueError(f"unknown function {function!r}; one of {FUNCTIONS}")


def duration(seconds: float) -> str:
    """A PromQL range: whole minutes as `15m`, else seconds."""
    return f"{int(seconds // 60)}m" if seconds % 60 == 0 else f"{int(round(seconds))}s"


@dataclass(frozen=True)
class Rule:
    alert: str
    conditions: tuple[Condition, ...]  # joined with `and`: the first's series that match one of each other's
    summary: str
    severity: str = "warning"
    for_minutes: float = 5.0

    def promql(self, window_s: float) -> str:
        return " and ".join(f"({c.promql(window_s)})" if len(self.conditions) > 1 else c.promql(window_s)
                            for c in self.conditions)

    def evaluate(self, rows: list[dict], window_s: float) -> dict[tuple, float]:
        """The firing series (labels) with the first condition's value; empty when the rule does not fire."""
        first, *rest = self.conditions
        fired = first.evaluate(rows, window_s)
        for c in rest:
            other = c.evaluate(rows, window_s)
            fired = {labels: v for labels, v in fired.items() if labels in other}
        return fired


ALERTS = ("AgentrlEnvCreationFailures", "AgentrlSandboxLeaks", "AgentrlSandboxMemoryHigh", "AgentrlSandboxMemoryCreep",
          "AgentrlTrainerIdle", "AgentrlWeightSyncShare", "AgentrlRewardPinnedAtMax")  # the names `rules` gives, in order


def rules(observe, reward_max: float) -> list[Rule]:
    """The rules with `observe.alert_*` thresholds; `reward_max`: the highest reward reward.weights can give."""
    o = observe
    mb = keys.env_resource("<h>", "peak_mem_mb_max")
    return [
        Rule("AgentrlEnvCreationFailures", (Condition("agentrl_env_create_failures", "increase", ">", o.alert_create_failures,
                                                      by=("harness",)),),
             f"a harness's environment creations failed more than {o.alert_create_failures} times in the window", "critical"),
        Rule("AgentrlSandboxLeaks", (Condition("agentrl_sandbox_leaked_processes", "increase", ">", 0),),
             "processes outlived their sandbox (sandbox/<harness>/leaked_processes rose)", "critical"),
        Rule("AgentrlSandboxMemoryHigh", (Condition(_metric(mb), "max_over_time", ">", o.alert_peak_memory_mb),),
             f"an episode's sandbox peaked above {number(o.alert_peak_memory_mb)} MiB ({mb})"),
        Rule("AgentrlSandboxMemoryCreep", (Condition(_metric(mb), "deriv", ">", o.alert_memory_creep_mb_per_hour,
                                                     scale=3600.0),),
             f"the sandboxes' per-episode peak memory rises faster than {number(o.alert_memory_creep_mb_per_hour)} MiB/hour"),
        Rule("AgentrlTrainerIdle", (Condition(_metric(keys.time_share("sampling")), "avg_over_time", ">", o.alert_sampling_share),),
             f"the trainer waits for rollouts more than {o.alert_sampling_share:.0%} of each step"),
        Rule("AgentrlWeightSyncShare", (Condition(_metric(keys.time_share("sync")), "avg_over_time", ">", o.alert_sync_share),),
             f"weight sync takes more than {o.alert_sync_share:.0%} of each step"),
        Rule("AgentrlRewardPinnedAtMax", (Condition(_metric(keys.REWARD_MEAN), "min_over_time", ">=", PINNED_FRACTION * reward_max),
                                          Condition(_metric(keys.REWARD_STD), "max_over_time", "<=", REWARD_STD_FLAT)),
             f"every episode in the window scored the maximum {reward_max:g} with no spread: check the reward for a leak"),
    ]


def _metric(key: str) -> str:
    named = series(key)
    if named is None:
        raise ValueError(f"{key} is not a Prometheus series")
    return named[0]


def window_s(observe) -> float:
    return float(observe.alert_window_minutes) * 60.0


def rule_file(observe, reward_max: float) -> dict:
    """The Prometheus rule file (groups[].rules[]: alert, expr, for, labels, annotations)."""
    w = window_s(observe)
    return {"groups": [{"name": "agentrl", "rules": [
        {"alert": r.alert, "expr": r.promql(w), "for": duration(r.for_minutes * 60),
         "labels": {"severity": r.severity}, "annotations": {"summary": r.summary}}
        for r in rules(observe, reward_max)]}]}


def render(observe, reward_max: float) -> str:
    return yaml.safe_dump(rule_file(observe, reward_max), sort_keys=False, width=1000)
