"""The runbook: the nine stages in order, and the runner that executes a selection of them.

Each stage module `stages/sN_*.py` exposes `run(ctx) -> StageReport`. The runner contains every
failure (an exception becomes a failing check with its traceback), applies `--strict`, notes
prerequisites that failed or never ran, and writes `reports/stage-N.{json,md}`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from agentrl_cli.config import LoadedConfig
from agentrl_cli.acceptance.context import StageContext, StageOptions
from agentrl_cli.core.errors import EXIT_CHECK_FAILED, EXIT_OK, UsageError
from agentrl_cli.core.report import Check, CheckStatus, StageReport, apply_strict, stage_status, write_report
from agentrl_cli.core.rundir import RunDir


@dataclass(frozen=True)
class StageSpec:
    number: int
    slug: str
    title: str
    module: str
    prerequisites: tuple[int, ...]
    checks: str  # what the stage brings up or checks, one line


STAGES: tuple[StageSpec, ...] = (
    StageSpec(0, "baseline", "baseline", "stages.s0_baseline", (),
              "smallest model, few tasks, the whole loop once: time shares, tokens/s, env step latency -> baseline.json"),
    StageSpec(1, "network", "network and storage", "stages.s1_network", (),
              "all-reduce bus bandwidth and a hung rank named, checkpoint-dir write MB/s, small-file rate and free space, "
              "object store ops, sandbox network isolation and the egress allowlist"),
    StageSpec(2, "image", "image and runtime", "stages.s2_image", (),
              "version and licence lock per role, Dockerfiles rendered, environment matches the lock, per-role packages, "
              "build and verify inside with a builder"),
    StageSpec(3, "controlplane", "control plane", "stages.s3_controlplane", (),
              "state store writable; one leader of two, failover within the lease, deposed leader's writes refused; "
              "manifests validate; no-op job lands in its pool; preemption; quota wait with reason; priority order"),
    StageSpec(4, "inference", "inference", "stages.s4_inference", (2,),
              "server healthy, tokens/s and p99 under load, log-probs match a forward pass, weight update round trip"),
    StageSpec(5, "sandbox", "sandbox and harnesses", "stages.s5_sandbox", (1, 2),
              "create/exec/reclaim under concurrency, timeouts, clean reset, limits, egress denied; "
              "every harness played at the run's concurrency for it with nothing left behind"),
    StageSpec(6, "reward", "reward", "stages.s6_reward", (5,),
              "deterministic scores, explicit errors for bad input, idempotency cache, throughput"),
    StageSpec(7, "data", "data", "stages.s7_data", (1,),
              "write, partition, schema, compression, redaction, query, retention, replay without divergence"),
    StageSpec(8, "training", "training", "stages.s8_training", (0, 3, 4, 5, 6, 7),
              "smoke -> short -> full: finite loss, non-degenerate reward, checkpoint and resume, reward trend"),
)
BY_NUMBER = {s.number: s for s in STAGES}
MODEL_STAGES = (0, 4, 8)  # stages that run the configured model: their reports record its card
ORDERED_STAGES = (0, 8)  # stages whose reports record their order hash: stage 8 full needs them first (phase_order.py)
HARNESS_STAGES = (0, 5, 8)  # stages that play episodes of the configured harnesses


def parse_selection(text: str) -> list[int]:
    """'all', 'N', 'A..B' or a comma list of those -> stage numbers in runbook order."""
    text = text.strip().lower()
    if text == "all":
        return [s.number for s in STAGES]
    chosen: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, sep, hi = part.partition("..")
        try:
            a, b = (int(lo), int(hi)) if sep else (int(part), int(part))
        except ValueError:
            raise UsageError(f"bad stage selector {text!r}", "use a stage number (3), a range (0..4), a list (0,2,5) or `all`") from None
        if a > b or a not in BY_NUMBER or b not in BY_NUMBER:
            raise UsageError(f"stage selector {part!r} is outside the runbook", f"stages are numbered {STAGES[0].number}..{STAGES[-1].number}")
        chosen.update(range(a, b + 1))
    if not chosen:
        raise UsageError("no stage selected", "use a stage number (3), a range (0..4), a list (0,2,5) or `all`")
    return sorted(chosen)


def run_stage(spec: StageSpec, ctx: StageContext) -> StageReport:
    """Run one stage with containment; never raises for a failure inside the stage."""
    try:
        module = importlib.import_module(spec.module)
        report = module.run(ctx)
        if not isinstance(report, StageReport):
            raise TypeError(f"{spec.module}.run returned {type(report).__name__}, not StageReport")
    except Exception as exc:  # noqa: BLE001 - a broken stage must not kill the run
        report = ctx.report([Check.crashed(f"stage {spec.number} runs to completion", exc)])
    if not report.checks:
        report.checks.append(Check("stage produced checks", CheckStatus.FAIL, 0, ">= 1 check", "the stage returned no checks",
                                   f"fix {spec.module}: a stage must measure something"))
    if ctx.options.strict:
        report.checks = apply_strict(report.checks)
    report.status = stage_status(report.checks)
    if spec.number in MODEL_STAGES:
        report.environment.setdefault("model_card", model_card(ctx))
    if spec.number in ORDERED_STAGES:
        from agentrl_cli.acceptance.phase_order import ORDER_HASH, order_hash

        report.environment.setdefault(ORDER_HASH, order_hash(ctx.loaded.resolved()))
    return report


def model_card(ctx: StageContext) -> dict | None:
    """The card of the model `model.path` names (source and checksum of an imported model, or the
    built-in model's build record); None when it does not resolve without building."""
    from agentrl_cli.core.errors import AgentrlError
    from agentrl_cli.model.describe import card
    from agentrl_cli.model.resolve import resolve_model_path

    m = ctx.config.model
    try:
        path = resolve_model_path(m.path, m.cache_dir, build=False)
    except AgentrlError:
        return None
    found = card(path)
    return {"model.path": m.path, "directory": str(path), **(found or {})}


def prerequisite_notes(spec: StageSpec, this_run: dict[int, StageReport], run: RunDir) -> list[str]:
    notes = []
    earlier = run.stage_reports()
    for n in spec.prerequisites:
        report = this_run.get(n) or earlier.get(n)
        title = BY_NUMBER[n].title
        if report is None:
            notes.append(f"prerequisite stage {n} ({title}) has not been run in run {run.run_id}")
        elif report.status == CheckStatus.FAIL:
            notes.append(f"prerequisite stage {n} ({title}) failed; failures here may follow from it")
    return notes


def run_stages(selection: list[int], loaded: LoadedConfig, run: RunDir, options: StageOptions,
               on_start: Callable[[StageSpec], None] = lambda spec: None,
               on_done: Callable[[StageSpec, StageReport], None] = lambda spec, report: None,
               progress: Callable[[str], None] = lambda message: None) -> list[StageReport]:
    """Run the selected stages in order, writing each report as soon as it is done."""
    reports: dict[int, StageReport] = {}
    for number in selection:
        spec = BY_NUMBER[number]
        on_start(spec)
        notes = prerequisite_notes(spec, reports, run)
        ctx = StageContext(loaded=loaded, run=run, stage=spec.number, title=spec.title, options=options, progress=progress)
        report = run_stage(spec, ctx)
        report.notes = notes + report.notes
        write_report(report, run.reports)
        reports[number] = report
        on_done(spec, report)
    return list(reports.values())


def exit_code(reports: list[StageReport]) -> int:
    return EXIT_CHECK_FAILED if any(r.status == CheckStatus.FAIL for r in reports) else EXIT_OK
