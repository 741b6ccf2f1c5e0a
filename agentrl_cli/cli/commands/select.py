"""`agentrl select`: seed 003 §四's framework-selection criteria measured against each installed
training backend, written as a scorecard (`agentrl_cli/acceptance/select/`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from agentrl_cli.cli.commands.common import ConfigOpt, JsonOpt, SetOpt, err, load, out, print_json
from agentrl_cli.core.errors import UsageError


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _ints(text: str, option: str) -> list[int]:
    try:
        values = [int(x) for x in _csv(text)]
    except ValueError:
        raise UsageError(f"{option} {text!r}: not a comma-separated list of whole numbers", f"e.g. {option} 1,2") from None
    if not values or min(values) < 1:
        raise UsageError(f"{option} {text!r}: give at least one number, each >= 1", f"e.g. {option} 1,2")
    return sorted(set(values))


def select_command(
    backends: Annotated[str, typer.Option("--backends", help="Training backends to compare, comma-separated "
                                          "(training.backend names; one not installed here is reported as skipped).")]
    = "deepspeed,fsdp",
    model: Annotated[Optional[str], typer.Option("--model", help="Model to probe with (default: model.path).",
                                                 show_default=False)] = None,
    memory_budget_gb: Annotated[float, typer.Option("--memory-budget-gb", min=0.01, help="Memory per rank the "
                                                    "parallel-strategy table finds the largest micro-batch for.")] = 8.0,
    criteria: Annotated[str, typer.Option("--criteria", help="Criteria to run, comma-separated: throughput, decoupled, "
                                          "parallel, integration, weight_sync, checkpoint, dependencies, maintenance; "
                                          "or all.")] = "all",
    stress_ranks: Annotated[str, typer.Option("--stress-ranks", help="Rank counts of the parallel-strategy table.")] = "1,2",
    micro_batches: Annotated[str, typer.Option("--micro-batches", help="Micro-batch sizes the table measures (at least "
                                               "two, for the memory fit).")] = "1,2,4",
    strategies: Annotated[str, typer.Option("--strategies", help="Strategies of the parallel-strategy table, "
                                            "comma-separated: zero0, zero1, zero2, zero3 (DeepSpeed), fsdp; or all (each "
                                            "backend's own).")] = "all",
    steps: Annotated[int, typer.Option("--steps", min=2, max=50, help="Steps of the short loop per backend.")] = 3,
    harness: Annotated[Optional[str], typer.Option("--harness", help="Harness for the integration criterion, by "
                                                   "module:Class (default: the first configured harness by its class "
                                                   "path).", show_default=False)] = None,
    config: ConfigOpt = None,
    sets: SetOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Measure the framework-selection criteria against each installed training backend: a scorecard.

    Seed 003 §四's eight criteria, each a probe run on this machine for each backend: token throughput
    observable (a short loop's sampling, training and sync seconds), training and inference decoupled
    (policy lag in an async loop; an aborted generation resumed from its partial tokens), parallel
    strategy and memory (ZeRO 0-3 and FSDP on 1 and 2 ranks: peak memory per rank, step time, the
    largest micro-batch within --memory-budget-gb), custom environment integration (the harness
    contract checks), weight-sync share of the step, checkpoint resume (own, the kept fixtures of
    earlier versions, the other backend's), dependencies and licences (the image lock), maintenance
    (installed metadata, never the network). Each cell: the measured value, how it was measured, pass
    or fail against the stated threshold, and the deployment action. Writes
    runs/RUN_ID/reports/select.json and select.md and a section of the run's report.html.

    Exit 0 when every requested criterion has a measured value for every requested backend (a failing
    criterion is a finding, not an error); 1 when a cell could not be measured (skipped: e.g. a
    backend not installed; or its probe raised), listed under `unmeasured`; 2 on bad usage.

    Examples:

    * `agentrl select --json`

    * `agentrl select --backends deepspeed --memory-budget-gb 16`

    * `agentrl select --criteria parallel --stress-ranks 1,2 --micro-batches 1,2,4,8`
    """
    from agentrl_cli.model.resolve import resolve_model_path
    from agentrl_cli.acceptance.select.probes import KNOWN_BACKENDS, Options, run_probes
    from agentrl_cli.acceptance.select.scorecard import CRITERIA

    names = _csv(backends)
    loaded = load(config, sets)
    cfg = loaded.config
    from agentrl_cli.learner.backend import BACKENDS

    unknown = [b for b in names if b not in BACKENDS and b not in KNOWN_BACKENDS]
    if not names or unknown:
        raise UsageError(f"--backends {backends!r}: unknown backend(s) {', '.join(unknown) or '(none given)'}",
                         f"name some of: {', '.join(dict.fromkeys([*BACKENDS, *KNOWN_BACKENDS]))}")
    keys = [c.key for c in CRITERIA]
    chosen = keys if criteria.strip() == "all" else _csv(criteria)
    bad = [c for c in chosen if c not in keys]
    if not chosen or bad:
        raise UsageError(f"--criteria {criteria!r}: unknown criterion {', '.join(bad) or '(none given)'}",
                         f"name some of: {', '.join(keys)}; or all")
    sizes = _ints(micro_batches, "--micro-batches")
    if len(sizes) < 2:
        raise UsageError(f"--micro-batches {micro_batches!r}: the memory fit needs at least two sizes", "e.g. --micro-batches 1,2,4")
    rank_counts = _ints(stress_ranks, "--stress-ranks")
    from agentrl_cli.acceptance.select.stress import all_strategies

    only = None if strategies.strip() == "all" else _csv(strategies)
    if only is not None and (not only or set(only) - set(all_strategies())):
        raise UsageError(f"--strategies {strategies!r}: unknown strategy {', '.join(sorted(set(only) - set(all_strategies()))) or '(none given)'}",
                         f"name some of: {', '.join(all_strategies())}; or all")
    opts = Options(backends=list(dict.fromkeys(names)), model=Path(resolve_model_path(model or cfg.model.path, cfg.model.cache_dir)),
                   criteria=[k for k in keys if k in chosen], memory_budget_gb=memory_budget_gb,
                   stress_ranks=rank_counts, micro_batches=sizes, strategies=only, steps=steps,
                   harness=harness)
    from agentrl_cli.acceptance.run_report import report_or_reason
    from agentrl_cli.acceptance.run_meta import create_run
    from agentrl_cli.core.rundir import now_iso

    run = create_run(loaded)
    console = err()
    started = now_iso()
    card = run_probes(cfg, opts, run.path / "select", run.run_id, progress=lambda m: console.print(f"select: {m}", markup=False))
    card.started_at = started
    json_path, md_path = write_scorecard(card, run.reports)
    html, why = report_or_reason(run.path, cfg.data)
    card_dict = card.to_dict()
    if json_out:
        print_json({**card_dict, "reports": {"json": str(json_path), "markdown": str(md_path), "html": html}})
    else:
        _render(card)
        out().print(f"scorecard: {md_path}" + (f" · {html}" if html else f" (no HTML report: {why})"))
    raise typer.Exit(card.exit_code)


def write_scorecard(card, reports_dir: Path) -> tuple[Path, Path]:
    """reports/select.json and select.md, secrets redacted (a detail may quote a log)."""
    from agentrl_cli.core.redaction import current
    from agentrl_cli.core.report import atomic_write_text
    from agentrl_cli.acceptance.select.scorecard import REPORT_NAME

    redactor = current()
    json_path, md_path = reports_dir / f"{REPORT_NAME}.json", reports_dir / f"{REPORT_NAME}.md"
    atomic_write_text(json_path, json.dumps(redactor.strings(card.to_dict()), indent=2, default=str) + "\n")
    atomic_write_text(md_path, redactor.text(card.to_markdown()))
    return json_path, md_path


def _render(card) -> None:
    from rich.table import Table

    from agentrl_cli.cli.render import print_table
    from agentrl_cli.core.report import format_measured
    from agentrl_cli.acceptance.select.scorecard import BY_KEY

    table = Table(title=f"agentrl select (run {card.run_id})", title_justify="left")
    table.add_column("criterion")
    for b in card.backends:
        table.add_column(b)
    for c in card.criteria:
        table.add_row(BY_KEY[c].title, *(f"{card.cell(c, b).status}: {format_measured(card.cell(c, b).measured)}"
                                         for b in card.backends))
    print_table(out(), table)
    for miss in card.unmeasured():
        err().print(f"  not measured: {miss['criterion']} [{miss['backend']}]: {miss['why']}", style="yellow", markup=False)
