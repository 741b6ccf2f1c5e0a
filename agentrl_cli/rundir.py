"""Run directories: `runs/<run_id>/` with `meta.json`, `reports/`, `logs/` and `metrics.jsonl`.

Every run archives its resolved config, its hash, package versions, host, seeds, harness versions,
image tags and the task-set version in `meta.json`. Listing and finding runs and reports lives here.
"""

from __future__ import annotations

import json
import re
import secrets
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from agentrl_cli.config import LoadedConfig
from agentrl_cli.config.load import mask_override
from agentrl_cli.environment import host_facts, package_versions
from agentrl_cli.errors import NotFoundError, UsageError
from agentrl_cli.report import StageReport, atomic_write_text, read_report

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


def harness_records(loaded: LoadedConfig) -> list[dict]:
    from harnesses.base import CONTRACT_VERSION
    from harnesses.registry import harness_version  # local: harness modules may be heavy

    return [{"name": h.name, "version": harness_version(h.name), "contract": CONTRACT_VERSION, "image_tag": h.image_tag,
             "held_out": h.held_out} for h in loaded.config.harnesses]


def create_run(loaded: LoadedConfig, run_id: str | None = None, command: list[str] | None = None) -> RunDir:
    """Create (or reopen, when `run_id` names an existing run) a run directory and write meta.json."""
    root = Path(loaded.config.observe.runs_dir)
    if run_id is not None and not RUN_ID_RE.match(run_id):
        raise UsageError(f"bad run id {run_id!r}", "use letters, digits, '.', '_' and '-' only")
    run = RunDir(root / (run_id or new_run_id()))
    run.reports.mkdir(parents=True, exist_ok=True)
    run.logs.mkdir(parents=True, exist_ok=True)
    previous = run.meta()
    cfg = loaded.config
    meta = {
        "schema_version": META_SCHEMA_VERSION,
        "run_id": run.run_id,
        "created_at": previous.get("created_at") or now_iso(),
        "updated_at": now_iso(),
        "command": [mask_override(a) for a in (command if command is not None else sys.argv)],
        "config_source": loaded.source,
        "config_overrides": loaded.masked_overrides(),
        "config_hash": loaded.hash,
        "config": loaded.resolved(),
        "packages": package_versions(),
        "host": host_facts(),
        "seeds": {"rollout": cfg.rollout.seed, "training": cfg.training.seed},
        "harnesses": harness_records(loaded),
        "image_tags": {h.name: h.image_tag for h in cfg.harnesses} | {"base": cfg.cluster.base_image},
        "task_set_version": task_set_version(),
        "image_lock": image_lock_record(cfg),
    }
    if previous and previous.get("config_hash") not in (None, loaded.hash):
        meta["config_history"] = previous.get("config_history", []) + [previous.get("config_hash")]
    atomic_write_text(run.meta_path, json.dumps(meta, indent=2, default=str) + "\n")
    return run


def image_lock_record(cfg) -> dict:
    from agentrl_cli.image.lock import run_record  # local: reads every installed package's metadata

    try:
        return run_record(cfg)
    except Exception as exc:  # noqa: BLE001 - a run is never refused for its metadata; the reason is recorded
        return {"error": f"{type(exc).__name__}: {exc}"}


def task_set_version() -> str:
    from harnesses.tasks import TASK_SET_VERSION, task_set_digest

    return f"{TASK_SET_VERSION}+{task_set_digest()}"


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
