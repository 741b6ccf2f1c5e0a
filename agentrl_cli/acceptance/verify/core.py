"""The verify report and the order of its layers: read the run, measure what is missing, judge
every selected layer (a layer that raises becomes a failing check with its traceback, never a
crash), and render JSON and Markdown."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from agentrl_cli.config import LoadedConfig
from agentrl_cli.acceptance.run_record import RunRecord, load_record
from agentrl_cli.core.errors import AgentrlError
from agentrl_cli.core.report import (SCHEMA_VERSION, Check, CheckStatus, apply_strict, atomic_write_text, checks_markdown,
                                count_statuses, counts_line, stage_status)
from agentrl_cli.core.rundir import RunDir, now_iso
from agentrl_cli.acceptance.verify import connectivity, convergence, correctness, cross_harness, performance


@dataclass(frozen=True)
class Layer:
    key: str
    title: str
    checks: Callable[["VerifyContext"], list[Check]]
    needs_training: bool = False


LAYERS: tuple[Layer, ...] = (
    Layer("connectivity", "connectivity", connectivity.checks),
    Layer("correctness", "correctness", correctness.checks, needs_training=True),
    Layer("performance", "performance against the stage-0 baseline", performance.checks),
    Layer("convergence", "small-sample convergence", convergence.checks, needs_training=True),
    Layer("cross_harness", "cross-harness", cross_harness.checks, needs_training=True),
)
LAYER_KEYS = tuple(layer.key for layer in LAYERS)


@dataclass
class VerifyContext:
    loaded: LoadedConfig
    run: RunDir
    record: RunRecord

    @property
    def config(self):
        return self.loaded.config

    def trajectories(self) -> list:
        """The stored trajectories of the judged loop (empty when the store cannot be read: that is
        the connectivity layer's finding)."""
        return self.record.training_trajectories(self.config.data)


@dataclass
class VerifyReport:
    status: CheckStatus
    layers: dict[str, list]  # layer key -> list of Check
    started_at: str
    duration_s: float
    run_id: str
    config_hash: str
    judged: str = ""  # what training was judged
    notes: list[str] = field(default_factory=list)

    def checks(self) -> list[Check]:
        return [c for checks in self.layers.values() for c in checks]

    def counts(self) -> dict[str, int]:
        return count_statuses(self.checks())

    def layer_status(self) -> dict[str, CheckStatus]:
        return {k: stage_status(v) for k, v in self.layers.items()}

    def to_dict(self) -> dict:
        return {"schema_version": SCHEMA_VERSION, "kind": "verify", **asdict(self), "layer_status": self.layer_status(),
                "counts": self.counts()}

    def to_markdown(self) -> str:
        out = [f"# agentrl verify — {self.status.upper()}", "",
               f"run `{self.run_id}` · config `{self.config_hash}` · started {self.started_at} · {self.duration_s:.1f} s · "
               f"{counts_line(self.checks())}", "", f"judged: {self.judged}", ""]
        out += [f"- {n}" for n in self.notes] + ([""] if self.notes else [])
        for layer in LAYERS:
            if layer.key not in self.layers:
                continue
            checks = self.layers[layer.key]
            out += [f"## {layer.title} — {stage_status(checks).upper()}", "", *checks_markdown(checks, level=3), ""]
        return "\n".join(out) + "\n"


def write_verify_report(report: VerifyReport, reports_dir: Path) -> tuple[Path, Path]:
    """`reports/verify.{json,md}`."""
    json_path, md_path = reports_dir / "verify.json", reports_dir / "verify.md"
    atomic_write_text(json_path, json.dumps(report.to_dict(), indent=2, default=str) + "\n")
    atomic_write_text(md_path, report.to_markdown())
    return json_path, md_path


def verify(loaded: LoadedConfig, run: RunDir, *, layers: list[str] | None = None, strict: bool = False, measure: bool = True,
           progress: Callable[[str], None] = lambda message: None) -> VerifyReport:
    """Judge `run`'s records layer by layer; with `measure`, first measure what the run lacks (a
    verification run when it has no training, the baseline loop again for the performance layer)."""
    from agentrl_cli.acceptance.verify import measure as measuring

    t0, started = time.perf_counter(), now_iso()
    selected = [layer for layer in LAYERS if layers is None or layer.key in layers]
    runs_dir = Path(loaded.config.observe.runs_dir)
    record = load_record(run, runs_dir)
    notes: list[str] = []
    out: dict[str, list] = {}
    must_train = measure and any(layer.needs_training for layer in selected) and not record.has_training
    must_probe = measure and any(layer.key == "performance" for layer in selected) and record.probe is None
    if must_train or must_probe or any(layer.key == "connectivity" for layer in selected):
        progress("connectivity")
        out["connectivity"] = _layer(LAYERS[0], VerifyContext(loaded, run, record))
    if (must_train or must_probe) and any(c.status == CheckStatus.FAIL for c in out["connectivity"]):
        notes.append("components are unreachable (see connectivity): verify started no verification run and no "
                     "baseline loop; fix them and run verify again")
        must_train = must_probe = False
    stopped: list[Check] = []  # measurements stopped by a named failure (a harness's own code, ...): failing checks
    if must_train:
        progress("no training to judge: starting the verification run")
        notes.append(_attempt(lambda: measuring.verification_run(loaded.config, run, progress), "the verification run", stopped))
    if must_probe:
        progress("measuring the stage-0 loop")
        notes.append(_attempt(lambda: measuring.baseline_loop(loaded.config, run, progress, as_baseline=record.baseline is None),
                              "measuring the stage-0 loop", stopped))
    ctx = VerifyContext(loaded, run, load_record(run, runs_dir))
    for layer in selected:
        if layer.key not in out:
            progress(layer.title)
            out[layer.key] = _layer(layer, ctx)
    if stopped and selected:
        out[selected[0].key] = stopped + out[selected[0].key]
    out = {layer.key: (apply_strict(out[layer.key]) if strict else out[layer.key]) for layer in selected}
    flat = [c for cs in out.values() for c in cs]
    return VerifyReport(status=stage_status(flat), layers=out, started_at=started, duration_s=round(time.perf_counter() - t0, 3),
                        run_id=run.run_id, config_hash=loaded.hash, judged=_judged(ctx.record), notes=notes)


def _layer(layer: Layer, ctx: VerifyContext) -> list[Check]:
    try:
        return layer.checks(ctx)
    except Exception as exc:  # noqa: BLE001 - one broken layer must not hide the others
        return [Check.crashed(f"{layer.key}: layer crashed", exc)]


def _attempt(fn: Callable[[], str], what: str, stopped: list[Check]) -> str:
    """Run a measurement; its failure is a note (its layers say what is missing), and a failure that
    names its cause and fix (an AgentrlError: a harness that stopped the run, ...) also a failing check."""
    try:
        return fn()
    except AgentrlError as exc:
        stopped.append(Check.crashed(what, exc))
        return f"{what} failed: {exc.message}"
    except Exception as exc:  # noqa: BLE001 - a failed measurement leaves its layers to say what is missing
        return f"{what} failed: {type(exc).__name__}: {exc}"


def _judged(record: RunRecord) -> str:
    if not record.has_training:
        return "no training recorded"
    return f"{len(record.rows)} trainer steps from {record.training_source} ({record.training_dir})"
