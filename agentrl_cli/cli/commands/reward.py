"""`agentrl reward train`: a reward model from the stored trajectories of runs (`runtime/reward/rm_train.py`),
served by `reward.verifiers: [reward_model]` (`runtime/reward/reward_model.py`)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from agentrl_cli.cli.commands.common import ConfigOpt, JsonOpt, SetOpt, load, out, print_json

app = typer.Typer(help="Train reward models on stored trajectories (served by reward.verifiers: [reward_model]).",
                  no_args_is_help=True)


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.3f}"


@app.command("train")
def train_command(
    from_runs: Annotated[str, typer.Option("--from", help="Run ids (under observe.runs_dir) or run directories, comma-separated.")],
    base: Annotated[str, typer.Option("--base", help="Base model (model.path syntax); default: the first run's model.path.")] = "",
    name: Annotated[str, typer.Option("--name", help="Saved as <model.cache_dir>/reward-models/NAME; default rm-RUN, RUN the first run id.")] = "",
    steps: Annotated[int, typer.Option("--steps", min=1, max=100_000, help="Optimizer steps of the value head.")] = 300,
    held_out: Annotated[float, typer.Option("--held-out", min=0.05, max=0.8, help="Share of the tasks held out for the report.")] = 0.3,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the task split and the bootstrap.")] = 0,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=16, help="Tokens of each trajectory's text kept (its end).")] = 1024,
    config: ConfigOpt = None,
    sets: SetOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Label each stored trajectory of the runs by its verified outcome (success or not; masked and
    unscored ones left out, counted), hold out a share of the TASKS, fit a value head on the frozen
    base's last hidden state, calibrate it (Platt, on train tasks), report held-out AUC with its 95%
    bootstrap interval over tasks and the calibration, and save the reward-model directory.

    Examples:

    * `agentrl reward train --from 20261129-101500-ab12cd`

    * `agentrl reward train --from RUN1,RUN2 --base builtin:tiny-agent --name arith-rm --json`
    """
    from agentrl_cli.runtime.reward.rm_train import Settings, train

    loaded = load(config, sets)
    runs = [r.strip() for r in from_runs.split(",") if r.strip()]
    record = train(loaded.config, runs, base=base, name=name,
                   settings=Settings(steps=steps, held_out_fraction=held_out, seed=seed, max_tokens=max_tokens),
                   progress=lambda message: typer.echo(f"reward train: {message}", err=True))
    if json_out:
        print_json(record)
        return
    held, counts = record["metrics"]["held_out"], record["counts"]
    ci = held["auc_ci95"]
    console = out()
    console.print(f"held-out AUC {_fmt(held['auc'])} (95% CI {_fmt(ci['low'])}-{_fmt(ci['high'])}, bootstrap over "
                  f"{held['tasks']} held-out tasks), ECE {held['ece']:.3f} after Platt ({held['ece_uncalibrated']:.3f} "
                  f"before), Brier {held['brier']:.3f}", markup=False)
    left_out = {k: v for k, v in counts.items() if k.startswith("left_out")}
    console.print(f"{counts['labelled']} labelled of {counts['trajectories']} stored ({counts['successes']} successes, "
                  f"{counts['failures']} not); left out: {left_out or 'none'}; held out {held['trajectories']} "
                  f"trajectories of {held['tasks']} tasks", markup=False)
    table = Table("p(success)", "count", "mean predicted", "observed")
    for row in held["reliability"]:
        table.add_row(f"{row['low']:.1f}-{row['high']:.1f}", str(row["count"]), f"{row['mean_predicted']:.3f}",
                      f"{row['observed']:.3f}")
    console.print(table)
    console.print(f"saved: {record['path']} (version {record['version']})", markup=False)
    typer.echo(f"use it: --set 'reward.verifiers=[reward_model]' --set reward.reward_model={record['path']} "
               "--set reward.weights.reward_model=0.1", err=True)
