"""`agentrl stage list|run|show`: the runbook from the command line."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from agentrl_cli.cli.commands.common import ConfigOpt, JsonOpt, RunOpt, SetOpt, load, out, print_json
from agentrl_cli.acceptance.context import StageOptions
from agentrl_cli.core.errors import UsageError
from agentrl_cli.core.outcomes import STAGE8_PHASES, Phase
from agentrl_cli.core.report import CheckStatus
from agentrl_cli.core.progress import stderr_console
from agentrl_cli.cli.render import StageProgress, print_table, render_report, render_summary
from agentrl_cli.acceptance.phase_order import require_earlier
from agentrl_cli.acceptance.run_meta import create_run
from agentrl_cli.core.rundir import find_stage_report
from agentrl_cli.acceptance.runbook import HARNESS_STAGES, MODEL_STAGES, STAGES, exit_code, parse_selection, run_stages

app = typer.Typer(help="Run the stage runbook (0..8) and read its reports.", no_args_is_help=True)



@app.command("list")
def list_stages(json_out: JsonOpt = False, config: ConfigOpt = None) -> None:
    """List the stages in order with what each checks and its prerequisites.

    Examples:

    * `agentrl stage list`

    * `agentrl stage list --json`
    """
    if json_out:
        print_json([{"stage": s.number, "slug": s.slug, "title": s.title, "prerequisites": list(s.prerequisites),
                     "checks": s.checks, "module": s.module} for s in STAGES])
        return
    table = Table("stage", "title", "needs", "checks")
    for s in STAGES:
        table.add_row(str(s.number), s.title, ",".join(map(str, s.prerequisites)) or "-", s.checks)
    print_table(out(), table)


@app.command("run")
def run(
    selection: Annotated[str, typer.Argument(help="A stage (3), a range (0..4), a list (0,2,5) or `all`.")],
    config: ConfigOpt = None,
    sets: SetOpt = None,
    strict: Annotated[bool, typer.Option("--strict", help="Treat skipped checks as failures.")] = False,
    phase: Annotated[str, typer.Option("--phase", help="Stage 8 phase: smoke, short or full.")] = Phase.SMOKE.value,
    run_id: Annotated[Optional[str], typer.Option("--run-id", help="Reuse or name the run directory (default: a new run).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Stage 8 full: run without a passing short run and stage 0 "
                                        "baseline of the same configuration (recorded in the report).")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show details and tracebacks of failing checks.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Run stages; write runs/<run_id>/reports/stage-N.{json,md}; exit 0 all passed, 1 a check failed, 2 bad usage.

    Examples:

    * `agentrl stage run all`

    * `agentrl stage run 0..4 --strict`

    * `agentrl stage run 8 --phase short --set training.total_steps=40`

    * `agentrl stage run 8 --phase full` (after a passing short run and stage 0 baseline of the same config)
    """
    if phase not in STAGE8_PHASES:
        raise UsageError(f"bad --phase {phase!r}", f"use one of: {', '.join(STAGE8_PHASES)}")
    stages = parse_selection(selection)
    loaded = load(config, sets)
    if 8 in stages and phase == Phase.FULL and not force:
        require_earlier(loaded.resolved(), Path(loaded.config.observe.runs_dir))  # smoke -> short -> full, refused out of order
    if any(n in HARNESS_STAGES for n in stages):
        from harnesses.configured import check_configured

        check_configured(loaded.config)  # a harness that cannot load is refused before any server starts
    run_dir = create_run(loaded, run_id)
    console, progress_console = out(), stderr_console()
    progress_console.print(f"run {run_dir.run_id}: stages {', '.join(map(str, stages))} -> {run_dir.path}", soft_wrap=True)
    if loaded.config.model.path.startswith("builtin:") and any(n in MODEL_STAGES for n in stages):
        progress_console.print(f"model {loaded.config.model.path}: installed on first use into {loaded.config.model.cache_dir} "
                               "from the copy shipped in the package (seconds, once), else loaded from there",
                               soft_wrap=True)
    show = StageProgress(progress_console)

    def on_done(spec, report) -> None:
        if not json_out:
            with show.paused():
                render_report(console, report, verbose=verbose)

    with show:
        reports = run_stages(stages, loaded, run_dir, StageOptions(strict=strict, phase=Phase(phase), force=force), on_start=show.start_stage,
                             on_done=on_done, progress=show.message)
    code = exit_code(reports)
    from agentrl_cli.acceptance.run_report import report_or_reason

    report_path, report_error = report_or_reason(run_dir.path, loaded.config.data)
    if json_out:
        print_json({"run_id": run_dir.run_id, "run_dir": str(run_dir.path), "exit_code": code,
                    "status": CheckStatus.FAIL if code else CheckStatus.PASS, "report": report_path, "reports": [r.to_dict() for r in reports]})
    else:
        render_summary(console, reports, str(run_dir.path))
    if report_path:
        progress_console.print(f"Run report: {report_path}  (`agentrl report {run_dir.run_id} --open`)", soft_wrap=True)
    else:
        progress_console.print(f"Run report not written: {report_error}", soft_wrap=True)
    raise typer.Exit(code)


@app.command("show")
def show(
    stage: Annotated[int, typer.Argument(help="Stage number.")],
    run: RunOpt = None,
    config: ConfigOpt = None,
    sets: SetOpt = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show details and tracebacks.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Show a stage's report from a run (default: the newest run that has one); exit 1 if it failed.

    Examples:

    * `agentrl stage show 4`

    * `agentrl stage show 4 --run 20261129-101500-ab12cd --json`
    """
    loaded = load(config, sets)
    report = find_stage_report(Path(loaded.config.observe.runs_dir), stage, run)
    if json_out:
        print_json(report.to_dict())
    else:
        render_report(out(), report, verbose=verbose)
        typer.echo(f"run {report.run_id} · started {report.started_at} · {report.duration_s:.1f} s")
    raise typer.Exit(1 if report.status == CheckStatus.FAIL else 0)
