"""Run directories: `runs/<run_id>/` with `meta.json`, `reports/`, `logs/` and `metrics.jsonl`.

Listing and finding runs and reports lives here. Creating a run and writing its `meta.json` (the
resolved config, package versions, host, seeds, harness versions, image tags and lock, task-set
version) lives in `agentrl_cli/acceptance/run_meta.py`.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from agentrl_cli.core.errors import NotFoundError
from agentrl_cli.core.report import StageReport, read_report

META_SCHEMA_VERSION = 1
RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def new_run_id() -> str:
    return f"{datetime.now(timezone.utc):%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


@dataclass
class RunDir:
    path: Path

    @property
    def run_id(self) -> str:
        return self.path.name

    @property
    def reports(self) -> Path:
        return self.path / "reports"

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    @property
    def meta_path(self) -> Path:
        return self.path / "meta.json"

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.jsonl"

    def meta(self) -> dict:
        try:
            return json.loads(self.meta_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}

    def stage_reports(self) -> dict[int, StageReport]:
        out = {}
        for p in sorted(self.reports.glob("stage-*.json")):
            try:
                r = read_report(p)
            except (OSError, ValueError, KeyError, TypeError):
                continue
            out[r.stage] = r
        return out


def list_runs(runs_dir: Path) -> list[RunDir]:
    """Runs under `runs_dir`, newest first (by meta.json creation time, then name)."""
    if not runs_dir.is_dir():
        return []
    runs = [RunDir(p) for p in runs_dir.iterdir() if p.is_dir() and (p / "meta.json").exists()]
    return sorted(runs, key=lambda r: (r.meta().get("created_at", ""), r.run_id), reverse=True)


def get_run(runs_dir: Path, run_id: str | None) -> RunDir:
    """The named run, or the newest when `run_id` is None or 'latest'."""
    runs = list_runs(runs_dir)
    if run_id in (None, "latest"):
        if not runs:
            raise NotFoundError(f"no runs under {runs_dir}", "run `agentrl stage run all` first, or set observe.runs_dir")
        return runs[0]
    run = RunDir(runs_dir / run_id)
    if not run.meta_path.exists():
        known = ", ".join(r.run_id for r in runs[:5]) or "none"
        raise NotFoundError(f"no run {run_id!r} under {runs_dir}", f"`agentrl runs list` shows the runs (newest: {known})")
    return run


def find_stage_report(runs_dir: Path, stage: int, run_id: str | None = None) -> StageReport:
    """Stage N's report from the named run, or from the newest run that has one."""
    if run_id not in (None, "latest"):
        run = get_run(runs_dir, run_id)
        report = run.stage_reports().get(stage)
        if report is None:
            raise NotFoundError(f"run {run.run_id} has no report for stage {stage}", f"run `agentrl stage run {stage}`")
        return report
    for run in list_runs(runs_dir):
        report = run.stage_reports().get(stage)
        if report is not None:
            return report
    raise NotFoundError(f"no report for stage {stage} under {runs_dir}", f"run `agentrl stage run {stage}` first")
