"""`agentrl harness check|list`: check one harness against the contract without a model, and list
the registered ones."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from agentrl_cli.cli.commands.common import ConfigOpt, JsonOpt, SetOpt, checks_json, finish, load, out, print_json
from agentrl_cli.cli.render import print_table, render_checks

app = typer.Typer(help="Check a harness against the contract without a model; list the registered ones.", no_args_is_help=True)


@app.command("check")
def check(
    target: Annotated[str, typer.Argument(help="A registered harness name or a module:Class path.")],
    config: ConfigOpt = None,
    sets: SetOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Load the harness, check its members against the contract, show the defaults agentrl applies,
    its reward source and tasks, and play one episode (its scripted solution, else plain actions).
    Options come from the config's `harnesses[]` entry of the same name. Exit 1 when a check fails.

    Examples:

    * `agentrl harness check terminal_like`

    * `agentrl harness check my_pkg.envs:MyHarness --json`

    * `agentrl harness check reasoning_gym --set 'harnesses=[{"name": "reasoning_gym", "options": {"dataset": "leg_counting"}}]'`
    """
    from harnesses.checkup import check_harness

    checks = check_harness(target, load(config, sets).config)
    if json_out:
        print_json(checks_json(checks, harness=target))
    else:
        render_checks(out(), checks, f"harness {target}")
    finish(checks)


@app.command("list")
def list_harnesses(json_out: JsonOpt = False) -> None:
    """The harnesses registered in the `agentrl.harnesses` entry-point group, by name.

    Example: `agentrl harness list --json`
    """
    from harnesses.registry import registered

    found = registered()
    if json_out:
        print_json({"harnesses": found})
        return
    table = Table(title="registered harnesses", title_justify="left")
    table.add_column("name")
    table.add_column("class")
    for name, path in sorted(found.items()):
        table.add_row(name, path)
    print_table(out(), table)
