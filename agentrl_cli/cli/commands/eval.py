"""`agentrl eval`: evaluate a model or a run's newest checkpoint, greedy and sampled, with pass@k per
harness and task family; `--resume` finishes an interrupted evaluation (`agentrl_cli/acceptance/evaluation/`)."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer
from rich.table import Table

from agentrl_cli.cli.commands.common import ConfigOpt, JsonOpt, SetOpt, err, load, out, print_json
from agentrl_cli.core.errors import EXIT_CHECK_FAILED, UsageError


def eval_command(
    model: Annotated[Optional[str], typer.Argument(
        metavar="MODEL_OR_RUN", help="A model (directory, builtin:tiny-agent, an imported model's name) or a run (id, "
                                       "`latest` or directory: its newest checkpoint, merged). Default: model.path.",
        show_default=False)] = None,
    harness: Annotated[Optional[list[str]], typer.Option(
        "--harness", help="Evaluate this configured harness (repeatable; default: every configured one, held-out included).",
        show_default=False)] = None,
    split: Annotated[Optional[str], typer.Option("--split", help="Task split to evaluate (default: eval).",
                                                 show_default=False)] = None,
    k: Annotated[Optional[str], typer.Option("-k", "--k", help="pass@k for these k, comma-separated (default: 1).",
                                             show_default=False)] = None,
    samples: Annotated[Optional[int], typer.Option(
        "--samples", min=0, help="Sampled episodes per task at inference.temperature (default: the largest k when it "
                                 "is above 1, else 0: pass@1 is then over the greedy episodes).", show_default=False)] = None,
    limit: Annotated[Optional[int], typer.Option(
        "--limit", min=1, help="At most this many tasks of each family per harness, spread over it (default: all).",
        show_default=False)] = None,
    resume: Annotated[Optional[str], typer.Option(
        "--resume", metavar="EVAL_ID", help="Finish this evaluation (its id, directory, or `latest`): play only the "
                                            "episodes missing or lost to an infrastructure error, then total all.",
        show_default=False)] = None,
    config: ConfigOpt = None,
    sets: SetOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Evaluate a model or a run's checkpoint: greedy success and pass@k per harness and task family, resumable.

    Each task of the split is played once greedily and, for pass@k, `--samples` times at
    inference.temperature (seeded from rollout.seed), through the same rollout, harnesses, sandboxes
    and reward as training; rollout.eval_concurrency episodes at once (1: the same weights always
    score the same). Trajectories go to the store (phase `eval`, the evaluation id as run id);
    `runs/<eval_id>/` holds the plan (eval.json), one row per finished episode (results.jsonl) and the
    totals (summary.json). pass@k is the unbiased estimator 1 - C(n-c, k)/C(n, k). Exit 0 when every
    episode was scored, 1 when some were lost to infrastructure errors (`--resume` plays them), 2 on bad usage.

    Examples:

    * `agentrl eval builtin:tiny-agent --harness tool_api_like -k 1,4`

    * `agentrl eval latest --limit 5 --json` (the newest run's newest checkpoint)

    * `agentrl eval ./exported-model --split train --samples 8 -k 1,2,8`

    * `agentrl eval --resume latest`
    """
    from agentrl_cli.config.load import mask_override
    from agentrl_cli.acceptance.evaluation import session
    from agentrl_cli.acceptance.evaluation.plan import parse_ks
    from agentrl_cli.core.progress import WorkProgress

    command = [mask_override(a) for a in sys.argv]
    if resume is not None:
        given = [name for name, value in (("--harness", harness), ("--split", split), ("-k", k), ("--samples", samples),
                                          ("--limit", limit)) if value is not None]
        if given:
            raise UsageError(f"{', '.join(given)} cannot change a resumed evaluation: it plays its own plan",
                             f"leave {', '.join(given)} out with --resume, or start a new evaluation")
    ks = parse_ks(k or "1")
    loaded = load(config, sets)
    with WorkProgress("agentrl eval", phase="starting") as progress:
        if resume is not None:
            outcome = session.resume(loaded, resume, model, command=command, progress=progress.update)
        else:
            outcome = session.start(loaded, model, harnesses=harness, split=split, ks=ks, samples=samples, limit=limit,
                                    command=command, progress=progress.update)
        progress.outcome = f"{outcome.played_now} episodes played"
    result = outcome.to_dict()
    for change in outcome.config_changes:
        err().print(f"note: the config differs from the evaluation's: {change}", style="yellow", soft_wrap=True)
    if json_out:
        print_json(result)
    else:
        render(result)
    if not result["complete"]:
        lost = result["all"]["errors"] + result["all"]["missing"]
        err().print(f"{lost} episodes were lost to infrastructure errors; `agentrl eval --resume {result['eval_id']}` "
                    "plays them again", style="red", soft_wrap=True)
        raise typer.Exit(EXIT_CHECK_FAILED)


def render(result: dict) -> None:
    ks = [str(k) for k in result["ks"]]
    table = Table("harness", "family", "tasks", "greedy", *(f"pass@{k}" for k in ks), "episodes", "errors",
                  title=f"agentrl eval {result['eval_id']}", title_justify="left")
    for name, h in result["harnesses"].items():
        label = f"{name} (held out)" if h["held_out"] else name
        for family, f in h["families"].items():
            table.add_row(label, family or "-", *_cells(f, ks))
        table.add_row(label, "all", *_cells(h, ks), style="bold")
    if len(result["harnesses"]) > 1:
        table.add_row("all", "", *_cells(result["all"], ks), style="bold")
    console = out()
    console.print(table)
    over = "samples" if result["samples"] else "greedy episodes"
    console.print(f"model {result['model']['spec']}; split {result['split']}; {result['samples']} samples per task at "
                  f"temperature {result['temperature']:g}; pass@k over the {over}; {result['played_now']} of "
                  f"{result['episodes_planned']} episodes played now")
    console.print(f"eval dir: {result['dir']}")


def _cells(group: dict, ks: list[str]) -> list[str]:
    g = group["greedy"]
    greedy = f"{g['success']}/{g['n']} ({g['rate']:.0%})" if g["n"] else "-"
    passes = [f"{group['pass_at_k'][k]['value']:.3f}" if group["pass_at_k"][k]["value"] is not None else "-" for k in ks]
    return [str(group["tasks"]), greedy, *passes, str(group["episodes"]), str(group["errors"] + group["missing"])]
