"""What a run recorded, read back once for `agentrl verify` and `agentrl troubleshoot --run`.

A run directory holds: `meta.json`, `reports/stage-N.json` (and `verify.json`), `baseline.json`
(stage 0), the training loops' `metrics.jsonl` (one row per trainer step, one row per evaluation)
under `stage8/` (stage 8) or `verify/` (the verification run verify starts itself), `verify/probe.json`
(the stage-0 loop measured again by verify), `verify/extra.json` (the verification run's canary
results, repeated tasks and resume) and checkpoints next to the metrics. Trajectories are in the
trajectory store, by run id. Nothing here judges.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from agentrl_cli.rundir import RunDir, list_runs

TRAINING_DIRS = ("verify", "stage8")  # where training loops of a run write metrics.jsonl, preferred first
MIN_TRAINING_STEPS = 3  # fewer steps say nothing about a trend


def read_jsonl(path: Path) -> list[dict]:
    """Rows of a JSON-lines file; a torn last line (a run killed mid-write) is left out."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def split_rows(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """(trainer-step rows of the last training segment, evaluation rows of that segment). A loop
    that starts again in the same file (a later phase) starts a new segment: its step goes back."""
    start, prev = 0, None  # prev: (index, step) of the last trainer-step row
    for i, row in enumerate(rows):
        if "train/loss" not in row:
            continue
        if prev is not None and row["step"] <= prev[1]:
            # the new loop's first evaluation (at its starting step) comes before its first step;
            # the old loop's last evaluation (at its last step) does not belong to it
            start = prev[0] + 1
            while start < i and rows[start].get("step", 0) >= row["step"]:
                start += 1
        prev = (i, row["step"])
    seg = rows[start:]
    train = [r for r in seg if "train/loss" in r]
    evals = [r for r in seg if any(k.startswith("eval/") for k in r)]
    return train, evals


@dataclass
class RunRecord:
    run: RunDir
    training_dir: Path | None = None
    rows: list[dict] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)
    baseline: dict | None = None
    baseline_path: Path | None = None
    probe: dict | None = None
    extra: dict = field(default_factory=dict)
    reports: dict = field(default_factory=dict)
    verify_report: dict | None = None

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

    def column(self, key: str) -> list[float]:
        """Every numeric value of `key` in the trainer-step rows, in step order."""
        return [r[key] for r in self.rows if isinstance(r.get(key), (int, float))]

    def eval_rates(self) -> dict[str, list[tuple[int, float]]]:
        """harness (or canary key) -> [(step, success rate)] in the order evaluated."""
        out: dict[str, list[tuple[int, float]]] = {}
        for row in self.evals:
            for k, v in row.items():
                if k.startswith("eval/") and k.endswith("/success_rate") and isinstance(v, (int, float)):
                    out.setdefault(k[len("eval/"):-len("/success_rate")], []).append((row.get("step", 0), float(v)))
        return out

    def eval_curve(self, harnesses: list[str]) -> list[tuple[int, int, int]]:
        """[(step, solved, episodes)] per evaluation, pooled over `harnesses`; empty unless every
        evaluation recorded each harness's episode count (`eval/<harness>/episodes`)."""
        curve = []
        for row in self.evals:
            counts = [(row.get(f"eval/{h}/success_rate"), row.get(f"eval/{h}/episodes")) for h in harnesses]
            if not harnesses or any(not isinstance(r, (int, float)) or not isinstance(n, int) for r, n in counts):
                return []
            curve.append((row.get("step", 0), sum(round(r * n) for r, n in counts), sum(n for _, n in counts)))
        return curve

    def trajectories(self, data_config, phase: str | None = None) -> list:
        """This run's stored trajectories (optionally one phase), read from the trajectory store."""
        import pyarrow.compute as pc

        from agentrl_cli.data.stores import open_store
        from agentrl_cli.data.writer import read_records

        expr = pc.field("run_id") == self.run.run_id
        if phase is not None:
            expr = expr & (pc.field("phase") == phase)
        return read_records(open_store(data_config), expr)


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


def load_record(run: RunDir, runs_dir: Path | None = None) -> RunRecord:
    rec = RunRecord(run=run)
    for name in TRAINING_DIRS:  # verify's own run, when there is one, is what verify judges
        d = run.path / name
        all_rows = read_jsonl(d / "metrics.jsonl")
        if all_rows:
            rec.training_dir = d
            rec.rows, rec.evals = split_rows(all_rows)
            break
    rec.baseline, rec.baseline_path = find_baseline(run, runs_dir or run.path.parent)
    rec.probe = read_json(run.path / "verify" / "probe.json")
    rec.extra = read_json(run.path / "verify" / "extra.json") or {}
    rec.reports = run.stage_reports()
    rec.verify_report = read_json(run.reports / "verify.json")
    return rec
