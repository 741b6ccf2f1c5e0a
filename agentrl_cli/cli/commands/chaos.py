"""`agentrl chaos`: a short training run with faults injected at seeded step boundaries; the report
of each fault and of what was lost (`agentrl_cli/acceptance/chaos/`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from agentrl_cli.cli.commands.common import ConfigOpt, JsonOpt, SetOpt, err, load, out, print_json
from agentrl_cli.core.errors import UsageError


def chaos_command(
    faults: Annotated[str, typer.Option("--faults", help="Faults to inject, comma-separated: server, rank, reward, "
                                        "sandbox, store; or all.")] = "all",
    seed: Annotated[int, typer.Option("--seed", help="Seed of the fault plan (order and step boundaries) and of the "
                                      "run (rollout.seed).")] = 0,
    steps: Annotated[int, typer.Option("--steps", min=8, max=1000, help="Trainer steps of each run.")] = 20,
    reference: Annotated[Optional[Path], typer.Option(
        "--reference", help="The uninterrupted run's ledger of trained draws (reference-ledger.json of an earlier "
                            "`agentrl chaos` with the same seed and steps) instead of training the reference here.",
        show_default=False, dir_okay=False, exists=True)] = None,
    config: ConfigOpt = None,
    sets: SetOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Train a short stage 8 run while injecting faults, and report how each fault was seen and recovered and what was lost.

    The run: two trainer ranks, two inference servers, the reward and sandbox services started as
    processes (the run's supervisor restarts them), an S3 store (moto's server mode, when installed).
    The faults, at seeded step boundaries: SIGKILL a trainer rank first (the run restarts from its
    latest checkpoint), then, into the resumed run, SIGKILL an inference server, the reward service
    unreachable for 5 s, the store unreachable for 5 s, SIGKILL the sandbox service. The report gives each fault (injected, seen, recovered, how, the bound it must
    meet) and the loss ledger (trajectories generated, stored, trained; missing; duplicated; the
    trained draws against an uninterrupted run with the same seed, trained first unless --reference
    is given: that doubles the time). Writes runs/RUN_ID/chaos/chaos.json; exit 0 when every fault was
    recovered within its bound and nothing was lost or duplicated, 1 otherwise, 2 on bad usage.

    Examples:

    * `agentrl chaos --json`

    * `agentrl chaos --faults server,rank --seed 7 --steps 16`

    * `agentrl chaos --reference runs/20261203-101500-ab12cd/chaos/reference-ledger.json --seed 0`
    """
    from agentrl_cli.acceptance.chaos.runner import chaos_sets, check_usage, run_chaos
    from agentrl_cli.acceptance.chaos.schedule import parse_faults
    from agentrl_cli.model.resolve import resolve_model_path
    from agentrl_cli.acceptance.run_meta import create_run

    try:
        kinds = parse_faults(faults)
    except ValueError as exc:
        raise UsageError(f"--faults {faults!r}: {exc}", "e.g. --faults server,rank,reward,sandbox,store") from None
    loaded = load(config, [*chaos_sets(steps), f"rollout.seed={seed}", *(sets or [])])
    cfg = loaded.config
    check_usage(cfg, kinds)
    model_path = resolve_model_path(cfg.model.path, cfg.model.cache_dir)
    run_dir = create_run(loaded)
    console = err()
    with console.status("chaos") as status:
        report = run_chaos(cfg, run_dir.path / "chaos", Path(model_path), run_id=run_dir.run_id, kinds=kinds, seed=seed,
                           steps=steps, reference=reference, progress=lambda m: status.update(f"chaos: {m}"))
    if json_out:
        print_json(report)
    else:
        _render(report)
    raise typer.Exit(0 if report["status"] == "pass" else 1)


def _render(report: dict) -> None:
    from rich.table import Table

    console = out()
    table = Table(title=f"agentrl chaos (run {report['run_id']}, seed {report['seed']}, {report['steps']} steps)")
    for column in ("fault", "target", "step", "seen (s)", "recovered (s)", "bound (s)", "how", "status"):
        table.add_column(column)
    for f in report["faults"]:
        table.add_row(f["fault"], f["target"], str(f["injected_step"]), _s(f["detect_s"]), _s(f["recover_s"]),
                      f"{f['detect_bound_s']:g} / {f['recover_bound_s']:g}", f["how"] or f["detail"], f["status"])
    console.print(table)
    losses = report["losses"]
    console.print(f"trajectories: generated {losses['generated']}, stored {losses['stored']}, trained {losses['trained']} "
                  f"(masked {losses['trained_masked']}); missing {losses['missing']}, duplicated {losses['duplicated']}; "
                  f"trained draws {'equal' if losses['draws_equal'] else 'differ from'} the uninterrupted run's "
                  f"({losses['draws']['trained']} vs {losses['draws']['reference']})")
    console.print(f"cost: faulted run {report['cost']['faulted_s']} s, reference {report['cost']['reference_s']} s "
                  f"({report['reference']['source']})")
    for problem in report["problems"]:
        console.print(f"  problem: {problem}", style="red")
    console.print(f"status: {report['status']}  (report: {report['run']['dir'].rsplit('/', 1)[0]}/chaos.json)")


def _s(x) -> str:
    return "-" if x is None else f"{x:g}"
