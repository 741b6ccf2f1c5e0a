"""`agentrl replay TRAJECTORY_ID`: re-run a stored trajectory and report the first divergence."""

from __future__ import annotations

from typing import Annotated

import typer

from agentrl_cli.cli.commands.common import ConfigOpt, JsonOpt, SetOpt, load, out, print_json
from agentrl_cli.core.errors import NotFoundError


def replay_command(
    trajectory_id: Annotated[str, typer.Argument(help="The trajectory_id to replay (see `agentrl data query`).")],
    config: ConfigOpt = None,
    sets: SetOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Rebuild the harness at the recorded version with the recorded task and seed, replay the
    recorded actions and compare every observation; exit 1 with a diff at the first divergence.

    Examples:

    * `agentrl replay 3f2a9c0d4e5b4f7a8c1d2e3f4a5b6c7d`

    * `agentrl replay 3f2a9c0d4e5b4f7a8c1d2e3f4a5b6c7d --json`
    """
    from agentrl_cli.runtime.data.replay import replay
    from agentrl_cli.runtime.data.stores import open_store
    from agentrl_cli.runtime.data.writer import find_trajectory

    loaded = load(config, sets)
    record = find_trajectory(open_store(loaded.config.data), trajectory_id)
    if record is None:
        raise NotFoundError(f"no trajectory {trajectory_id!r} in the {loaded.config.data.store} store ({loaded.config.data.root})",
                            "find ids with `agentrl data query --json`")
    report = replay(record, platform_config=loaded.config)
    if json_out:
        print_json(report.to_dict())
    else:
        console = out()
        role = f" (role {record.role}; every role's moves replayed)" if record.role else ""
        console.print(f"{record.harness} {record.harness_version}, task {record.task_id}{role}: "
                      f"{report.steps_compared}/{len(record.steps)} steps compared", markup=False)
        d = report.divergence
        if d is None:
            console.print("no divergence", markup=False)
        else:
            console.print(f"first divergence at step {d.step} ({d.field}):", markup=False)
            console.print(d.diff or f"recorded: {d.recorded}\nreplayed: {d.replayed}", markup=False)
    if not report.ok:
        raise typer.Exit(1)
