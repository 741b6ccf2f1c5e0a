"""What a run recorded, read back once: the one reader of a run directory, used by the HTML report
(`run_data.py`), `agentrl verify` and `agentrl troubleshoot --run`. Nothing here judges.

A run directory (`runs/<id>/`) holds: `meta.json`, `reports/stage-N.json` (and `verify.json`),
`baseline.json` (stage 0), the training loops' `metrics.jsonl` (one row per trainer step, one row
per evaluation) under `stage8/` (stage 8), `acceptance/verify/` (the verification run verify starts itself) or
`stage0/`, `verify/probe.json` (the stage-0 loop measured again by verify), `verify/extra.json` (the
verification run's canary results, repeated tasks and resume) and checkpoints next to the metrics.
Trajectories are in the trajectory store, by run id, each with the `Phase` of the loop that played it.

The judged loop is the first of TRAINING_DIRS that has rows (verify's own run, when there is one,
is what verify judges); its trajectories are those `judged_phase` accepts - the one phase filter
every reader applies.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from agentrl_cli.runtime.observe import keys
from agentrl_cli.runtime.observe.step_metrics import read_rows
from agentrl_cli.core.outcomes import Phase
from agentrl_cli.core.report import StageReport
from agentrl_cli.core.rundir import RunDir, list_runs

log = logging.getLogger(__name__)
TRAINING_DIRS = ("verify", "stage8")  # where the judged loop's metrics.jsonl is, preferred first
SHOWN_DIRS = ("stage8", "verify", "stage0")  # the metrics log whose curves a report draws, first found
MIN_TRAINING_STEPS = 3  # fewer steps say nothing about a trend
NOT_STAGE8 = (Phase.BASELINE, Phase.VERIFY, Phase.VERIFY_RESUME, Phase.PROBE)  # loops of a run that are not stage 8's training


def read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def split_rows(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """(trainer-step rows of the last training segment, evaluation rows of that segment). A loop
    that starts again in the same file (a later phase) starts a new segment: its step goes back."""
    start, prev = 0, None  # prev: (index, step) of the last trainer-step row
    for i, row in enumerate(rows):
        if not keys.is_step_row(row):
            continue
        if prev is not None and row[keys.STEP] <= prev[1]:
            # the new loop's first evaluation (at its starting step) comes before its first step;
            # the old loop's last evaluation (at its last step) does not belong to it
            start = prev[0] + 1
            while start < i and rows[start].get(keys.STEP, 0) >= row[keys.STEP]:
                start += 1
        prev = (i, row[keys.STEP])
    seg = rows[start:]
    return [r for r in seg if keys.is_step_row(r)], [r for r in seg if keys.is_eval_row(r)]


@dataclass
class RunRecord:
    run: RunDir
    meta: dict = field(default_factory=dict)
    logs: dict[str, list[dict]] = field(default_factory=dict)  # every metrics log: its directory's name ("run": the top one) -> rows
    training_dir: Path | None = None  # the judged loop's directory
    rows: list[dict] = field(default_factory=list)  # the judged loop's trainer-step rows (its last segment)
    evals: list[dict] = field(default_factory=list)  # the judged loop's evaluation rows
    baseline: dict | None = None
    baseline_path: Path | None = None
    probe: dict | None = None
    extra: dict = field(default_factory=dict)
    reports: dict[int, StageReport] = field(default_factory=dict)
    verify_report: dict | None = None
    _stored: list | None = field(default=None, repr=False)  # the store's trajectories, read once

    @property
    def has_training(self) -> bool:
        """Training that can be judged: enough steps, evaluated before and after (stage 8 short or
        full, or verify's own run). A smoke run evaluates nothing, so verify trains for itself."""
        return len(self.rows) >= MIN_TRAINING_STEPS and len(self.evals) >= 2

    @property
    def training_source(self) -> str:
        if self.training_dir is None:
            return "none"
        return "verify's own verification run" if self.training_dir.name == "verify" else f"{self.training_dir.name} metrics"

    @property
    def held_out(self) -> set[str]:
        """Harnesses the run archived as held out (never trained on)."""
        return {h.get("name") for h in self.meta.get("harnesses", []) if isinstance(h, dict) and h.get("held_out")}

    def column(self, key: str) -> list[float]:
        """Every numeric value of `key` in the judged loop's trainer-step rows, in step order."""
        return [r[key] for r in self.rows if isinstance(r.get(key), (int, float))]

    def eval_rates(self) -> dict[str, list[tuple[int, float]]]:
        """harness (or canary key) -> [(step, success rate)] in the order evaluated."""
        out: dict[str, list[tuple[int, float]]] = {}
        for row in self.evals:
            for k, v in row.items():
                h = keys.eval_harness(k)
                if h is not None and isinstance(v, (int, float)):
                    out.setdefault(h, []).append((row.get(keys.STEP, 0), float(v)))
        return out

    def eval_curve(self, harnesses: list[str]) -> list[tuple[int, int, int]]:
        """[(step, solved, episodes)] per evaluation, pooled over `harnesses`; empty unless every
        evaluation recorded each harness's episode count (`eval/<harness>/episodes`)."""
        curve = []
        for row in self.evals:
            counts = [(row.get(keys.eval_success_rate(h)), row.get(keys.eval_episodes(h))) for h in harnesses]
            if not harnesses or any(not isinstance(r, (int, float)) or not isinstance(n, int) for r, n in counts):
                return []
            curve.append((row.get(keys.STEP, 0), sum(round(r * n) for r, n in counts), sum(n for _, n in counts)))
        return curve

    def shown_log(self) -> tuple[str, list[dict]]:
        """(directory name, rows) of the metrics log a report draws: the first of SHOWN_DIRS with rows."""
        for name in (*SHOWN_DIRS, *sorted(self.logs)):
            if self.logs.get(name):
                return name, self.logs[name]
        return "", []

    def judged_phase(self, phase: str) -> bool:
        """Whether a trajectory of `phase` was played by the judged loop: verify's run plays
        `verify`; otherwise every phase but the baseline's and verify's own."""
        if self.training_dir is not None and self.training_dir.name == "verify":
            return phase == Phase.VERIFY
        return phase not in NOT_STAGE8

    def trajectories(self, data_config) -> list:
        """This run's stored trajectories (every phase), read from the trajectory store once; empty
        when the store cannot be read (the connectivity layer reports that)."""
        if self._stored is None:
            try:
                self._stored = self.read_trajectories(data_config)
            except Exception as exc:  # noqa: BLE001 - an unreadable store leaves the trajectory-based findings empty
                log.warning("reading the trajectories of run %s failed: %s", self.run.run_id, exc)
                self._stored = []
        return self._stored

    def training_trajectories(self, data_config) -> list:
        """The stored trajectories of the judged loop."""
        return [t for t in self.trajectories(data_config) if self.judged_phase(t.phase)]

    def read_trajectories(self, data_config) -> list:
        """This run's stored trajectories, read now; raises when the store cannot be read."""
        import pyarrow.compute as pc

        from agentrl_cli.runtime.data.stores import open_store
        from agentrl_cli.runtime.data.writer import read_records

        return read_records(open_store(data_config), pc.field("run_id") == self.run.run_id)

    def trajectory_table(self, store):
        """This run's stored trajectories as an Arrow table, from `store` (a TrajectoryStore)."""
        import pyarrow.compute as pc

        return store.read_table(pc.field("run_id") == self.run.run_id)


def find_baseline(run: RunDir, runs_dir: Path) -> tuple[dict | None, Path | None]:
    """The run's own baseline.json, else the newest run's that has one."""
    own = run.path / "baseline.json"
    if own.is_file():
        return read_json(own), own
    for other in list_runs(runs_dir):
        p = other.path / "baseline.json"
        if p.is_file():
            return read_json(p), p
    return None, None


def load_record(run: RunDir | Path, runs_dir: Path | None = None) -> RunRecord:
    """Everything the run at `run` recorded outside the trajectory store (that is read on demand)."""
    run = run if isinstance(run, RunDir) else RunDir(Path(run))
    rec = RunRecord(run=run, meta=read_json(run.meta_path) or {})
    for metrics in sorted([run.metrics_path, *run.path.glob("*/metrics.jsonl")]):
        rows = read_rows(metrics)
        if rows:
            rec.logs[metrics.parent.name if metrics.parent != run.path else "run"] = rows
    for name in TRAINING_DIRS:
        if rec.logs.get(name):
            rec.training_dir = run.path / name
            rec.rows, rec.evals = split_rows(rec.logs[name])
            break
    rec.baseline, rec.baseline_path = find_baseline(run, runs_dir or run.path.parent)
    rec.probe = read_json(run.path / "verify" / "probe.json")
    rec.extra = read_json(run.path / "verify" / "extra.json") or {}
    rec.reports = dict(sorted(run.stage_reports().items()))
    rec.verify_report = read_json(run.reports / "verify.json")
    return rec
