"""Stage 8 in order (smoke -> short -> full): `agentrl stage run 8 --phase full` starts only after a
passing stage 8 `short` run and a passing stage 0 baseline of the same configuration, unless
`--force`. The command refuses before it creates a run (exit 2, naming the missing run and the
command that makes it); stage 8 itself records what it found as its "earlier phases" check, and a
forced run says so there (and in its report's environment, `forced_order`).

The same configuration: equal `order_hash`es - the config hash with the phase budgets left out
(`PHASE_KEYS`): `training.total_steps` (the step budget: a short run is a few steps, the full one
as many as it takes) and the `stages` section (the phases' own budgets and recipe -
`stages.smoke_steps`, `stages.short_minutes`, `stages.full_minutes`, `stages.short_recipe`, the
evaluation interval - and the pass thresholds of every stage: what a phase is judged by, never what
is trained), and where a run listens and writes its observations (`inference.port`,
`training.master_port`, the `observe` section): they change where it serves, never what it trains.
Everything else (model, harnesses, rollout, reward, learner settings) must match. Every
stage report of stages 0 and 8 records its `order_hash` in its environment (runbook.run_stage);
a report written before that is matched through its run's meta.json when the config there is the
one the report ran with.

Belongs here: finding the earlier runs and judging the order. Running stage 8 does not
(`stages/s8_training.py`); the refusal's wording for the command line is `EarlierPhases.refusal`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from agentrl_cli.core.errors import UsageError
from agentrl_cli.core.outcomes import Phase
from agentrl_cli.core.report import Check, CheckStatus, StageReport
from agentrl_cli.core.rundir import list_runs

# dotted keys (a section or one key) a phase may set for itself, and the addresses a run listens on,
# which change where it serves, never what it trains
PHASE_KEYS = ("training.total_steps", "stages", "inference.port", "training.master_port", "observe")
ORDER_HASH = "order_hash"  # the stage report environment's key


def order_hash(config: dict) -> str:
    """The config hash (`config_hash`'s canonical JSON) of `config` (the resolved config as JSON
    data: `LoadedConfig.resolved()`, meta.json's "config") with PHASE_KEYS left out."""
    data = json.loads(json.dumps(config, default=str))
    for key in PHASE_KEYS:
        *parents, last = key.split(".")
        node = data
        for p in parents:
            node = node.get(p, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict):
            node.pop(last, None)
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def report_order_hash(report: StageReport, meta: dict) -> str | None:
    """The order hash `report` ran with: recorded in it, else from its run's meta.json when that
    config is the report's (the same config hash); None when neither says."""
    recorded = report.environment.get(ORDER_HASH)
    if recorded:
        return recorded
    if meta.get("config_hash") == report.config_hash and isinstance(meta.get("config"), dict):
        return order_hash(meta["config"])
    return None


@dataclass(frozen=True)
class Wanted:
    stage: int
    phase: str | None  # stage 8's phase; None for stage 0
    command: str

    @property
    def label(self) -> str:
        return f"stage {self.stage} {self.phase}" if self.phase else f"stage {self.stage} baseline"


SHORT = Wanted(8, Phase.SHORT, "agentrl stage run 8 --phase short")
BASELINE = Wanted(0, None, "agentrl stage run 0")
BEFORE_FULL = (SHORT, BASELINE)


@dataclass
class EarlierPhases:
    """What `full` needs and which runs supplied it: label -> run id (None: no passing run)."""

    order_hash: str
    runs_dir: Path
    found: dict[str, str | None] = field(default_factory=dict)

    @property
    def missing(self) -> list[Wanted]:
        return [w for w in BEFORE_FULL if self.found.get(w.label) is None]

    def refusal(self) -> UsageError:
        names = " and ".join(f"a passing {w.label} run" for w in self.missing)
        commands = "`, then `".join(w.command for w in reversed(self.missing))
        return UsageError(f"stage 8 --phase full needs {names} of this configuration (order hash {self.order_hash}: the "
                          f"config hash without {', '.join(PHASE_KEYS)}); none under {self.runs_dir}",
                          f"run `{commands}` first with the same --config and --set options (a different "
                          "training.total_steps or stages.* is fine), or pass --force to run full anyway")

    def check(self, forced: bool) -> Check:
        """Stage 8 full's record of the order: pass when both earlier runs passed; a forced run
        without them is `info` naming what was missing (nothing judged it)."""
        measured = {"order_hash": self.order_hash, **self.found, "forced": forced}
        if not self.missing:
            return Check("earlier phases", CheckStatus.PASS, measured, "a passing stage 8 short and stage 0 baseline "
                         "of the same configuration", "", "")
        missing = ", ".join(w.label for w in self.missing)
        if forced:
            return Check.info("earlier phases", measured, f"--force: run without a passing {missing} of this configuration")
        return Check.judge("earlier phases", False, measured, "a passing stage 8 short and stage 0 baseline of the same "
                           "configuration", self.refusal().hint)


def _passes(report: StageReport | None, wanted: Wanted) -> bool:
    return (report is not None and report.status == CheckStatus.PASS
            and (wanted.phase is None or report.environment.get("phase") == wanted.phase))


def find_earlier(config: dict, runs_dir: Path) -> EarlierPhases:
    """The newest passing run under `runs_dir` of each of BEFORE_FULL with `config`'s order hash."""
    wanted_hash = order_hash(config)
    found: dict[str, str | None] = {w.label: None for w in BEFORE_FULL}
    for run in list_runs(runs_dir):
        reports, meta = run.stage_reports(), run.meta()
        for w in BEFORE_FULL:
            report = reports.get(w.stage)
            if found[w.label] is None and _passes(report, w) and report_order_hash(report, meta) == wanted_hash:
                found[w.label] = run.run_id
    return EarlierPhases(wanted_hash, runs_dir, found)


def require_earlier(config: dict, runs_dir: Path) -> EarlierPhases:
    """`find_earlier`, raising its refusal (UsageError, exit 2) when a run is missing."""
    earlier = find_earlier(config, runs_dir)
    if earlier.missing:
        raise earlier.refusal()
    return earlier
