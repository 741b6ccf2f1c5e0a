"""What a run's report shows, gathered from the run's record (`run_record.py`: its metrics logs,
`meta.json`, the stage and verify reports) and its stored trajectories (evaluation metrics by
harness and phase, tool-call latencies, reward by harness over policy versions). Every part is
optional: an older or partial run has what it has. Belongs here: reshaping for the page; reading
the run directory is `run_record.py`, drawing is `plots.py`, the page is `run_report.py`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from agentrl_cli.runtime.observe import keys
from agentrl_cli.acceptance.run_record import RunRecord, load_record
from agentrl_cli.core.outcomes import Outcome

log = logging.getLogger(__name__)


@dataclass
class RunData:
    record: RunRecord
    eval_table: list[dict] = field(default_factory=list)  # data.metrics.compute_metrics by harness and phase
    tool_latency_ms: dict[str, list[float]] = field(default_factory=dict)  # harness -> tool-call latencies
    turn_generation_ms: dict[str, list[float]] = field(default_factory=dict)  # harness -> turn time minus tool time
    reward_by_version: dict[str, tuple[list, list]] = field(default_factory=dict)  # harness -> (versions, mean reward)
    success_by_version: dict[str, tuple[list, list]] = field(default_factory=dict)  # harness -> (versions, success rate)
    notes: list[str] = field(default_factory=list)

    @property
    def run_id(self) -> str:
        return self.record.run.run_id

    @property
    def path(self) -> Path:
        return self.record.run.path

    @property
    def meta(self) -> dict:
        return self.record.meta

    @property
    def held_out(self) -> set[str]:
        return self.record.held_out

    @property
    def stage_reports(self) -> list[dict]:
        return [r.to_dict() for r in self.record.reports.values()]

    @property
    def verify_report(self) -> dict | None:
        return self.record.verify_report

    def main_log(self) -> tuple[str, list[dict]]:
        return self.record.shown_log()

    def step_rows(self) -> list[dict]:
        return [r for r in self.main_log()[1] if keys.STEP in r and not keys.is_eval_row(r)]

    def eval_rows(self) -> list[dict]:
        return [r for r in self.main_log()[1] if keys.is_eval_row(r)]


def collect(run_path: Path, store=None) -> RunData:
    """Everything the report shows about the run at `run_path`; `store` (a TrajectoryStore) adds the
    trajectory-based parts."""
    data = RunData(load_record(Path(run_path)))
    if store is not None:
        try:
            _from_trajectories(data, store)
        except Exception as exc:  # noqa: BLE001 - an unreadable store leaves the metrics-based parts of the report
            log.warning("reading the run's trajectories failed: %s", exc)
            data.notes.append(f"trajectories not read ({type(exc).__name__}: {exc}); the evaluation table and "
                              "tool-call latencies are missing")
    return data


def _from_trajectories(data: RunData, store) -> None:
    from agentrl_cli.runtime.data.metrics import compute_metrics

    table = data.record.trajectory_table(store)
    if table.num_rows == 0:
        data.notes.append("the trajectory store holds no trajectory of this run")
        return
    data.eval_table = compute_metrics(table, group_by=("harness", "phase"))
    rows = table.select([c for c in ("harness", "phase", "steps", "reward", "outcome", "policy_version_first")
                         if c in table.column_names]).to_pylist()
    by_version: dict[str, dict] = {}
    for r in rows:
        h = r.get("harness") or "?"
        for step in r.get("steps") or []:
            tool_ms = 0.0
            for call in step.get("tool_calls") or []:
                if call.get("latency_ms") is not None:
                    data.tool_latency_ms.setdefault(h, []).append(float(call["latency_ms"]))
                    tool_ms += float(call["latency_ms"])
            if step.get("started_at") is not None and step.get("ended_at") is not None:
                turn_ms = (step["ended_at"] - step["started_at"]).total_seconds() * 1000
                data.turn_generation_ms.setdefault(h, []).append(max(0.0, turn_ms - tool_ms))
        if r.get("reward") is not None:
            v = str(r.get("policy_version_first") or "0")
            by_version.setdefault(h, {}).setdefault(v, []).append((r["reward"], r.get("outcome") == Outcome.SUCCESS))
    for h, versions in by_version.items():
        order = sorted(versions, key=lambda v: (len(v), v))
        xs = [int(v) if v.isdigit() else i for i, v in enumerate(order)]
        data.reward_by_version[h] = (xs, [sum(x[0] for x in versions[v]) / len(versions[v]) for v in order])
        data.success_by_version[h] = (xs, [sum(x[1] for x in versions[v]) / len(versions[v]) for v in order])


def series(rows: list[dict], key: str) -> tuple[list, list]:
    pts = [(r.get(keys.STEP), r.get(key)) for r in rows if isinstance(r.get(key), (int, float))]
    return [p[0] for p in pts], [p[1] for p in pts]


def samples(rows: list[dict], suffix: str) -> dict[str, list[float]]:
    """`<ns>/<harness>/<suffix>` sample lists of all rows, joined per harness."""
    out: dict[str, list[float]] = {}
    for r in rows:
        for k, v in r.items():
            parts = k.split("/")
            if len(parts) == 3 and parts[2] == suffix and isinstance(v, list):
                out.setdefault(parts[1], []).extend(x for x in v if isinstance(x, (int, float)))
    return out


def harness_levels(rows: list[dict]) -> dict[str, dict]:
    """The newest service-level figures per harness (`env/<h>/…`, `infer/<h>/…`, not sample lists)."""
    out: dict[str, dict] = {}
    for r in rows:
        for k, v in r.items():
            parts = k.split("/", 2)
            if len(parts) == 3 and parts[0] in keys.LEVEL_NAMESPACES and not isinstance(v, list):
                out.setdefault(parts[1], {})[parts[2]] = v
    return out
