"""`agentrl run servers add|remove|list`: inference servers joining and leaving a running training run.

The run watches `<run dir>/control/servers.json` (written here, under a lock) on every health tick of
its supervisor and writes what it sees to `control/status.json` (read by `list`); see
`agentrl_cli/run/supervise/control.py`. `--run` takes a run id (default: the newest run) or a directory;
within a run the training loop's own directory (`stage8/`, `acceptance/verify/`, ...) is the one whose status
was written last.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from agentrl_cli.cli.commands.common import ConfigOpt, JsonOpt, SetOpt, err, load, out, print_json
from agentrl_cli.core.errors import NotFoundError

app = typer.Typer(help="Act on a running training run: add and remove its inference servers, list them.",
                  no_args_is_help=True)
servers = typer.Typer(help="Inference servers joining and leaving a running run (elastic inference).", no_args_is_help=True)
app.add_typer(servers, name="servers")

UrlArg = Annotated[str, typer.Argument(help="The server's address: scheme, host and port (http://10.0.0.7:30000).")]
RunArg = Annotated[Optional[str], typer.Option("--run", help="Run id, `latest` (the default) or the run's directory.",
                                               show_default=False)]


def control_dir(config: Path | None, sets: list[str] | None, run: str | None) -> Path:
    """The control directory of the run's live training loop."""
    from agentrl_cli.core.rundir import get_run
    from agentrl_cli.run.supervise.control import CONTROL_DIR, STATUS

    if run is not None and Path(run).is_dir():
        root = Path(run)
    else:
        root = get_run(Path(load(config, sets).config.observe.runs_dir), run).path
    found = [d for d in (root / CONTROL_DIR, *root.glob(f"*/{CONTROL_DIR}"), *root.glob(f"*/*/{CONTROL_DIR}"))
             if (d / STATUS).is_file()]
    if not found:
        raise NotFoundError(f"no training loop under {root} has started its supervisor (no {CONTROL_DIR}/{STATUS})",
                            "start training first (`agentrl stage run 8`), with observe.health_interval_s above 0; "
                            "pass its directory with --run if it lives elsewhere")
    return max(found, key=lambda d: (d / STATUS).stat().st_mtime)


def _request(action: str, url: str, config, sets, run, json_out: bool) -> None:
    from agentrl_cli.run.supervise.control import request, server_url

    url = server_url(url)  # a usage error before any run is looked up
    control = control_dir(config, sets, run)
    requests = request(control, action, url)
    if json_out:
        print_json({"requested": action, "url": url, "control": str(control), "requests": requests})
        return
    what = ("joins the run once it answers /health and serves the run's weights (verified)" if action == "add" else
            "leaves the run's rotation at its next health tick; requests in flight there finish there")
    out().print(f"{url} {what}", markup=False)
    err().print(f"requested in {control}; `agentrl run servers list` shows what the run sees", markup=False)


@servers.command("add")
def add(url: UrlArg, run: RunArg = None, config: ConfigOpt = None, sets: SetOpt = None, json_out: JsonOpt = False) -> None:
    """Add an inference server to a running run: at its next health tick the run checks the server's
    health, gives it the run's current weights, verifies them, then sends it rollout requests.

    Examples:

    * `agentrl run servers add http://10.0.0.7:30000`

    * `agentrl run servers add http://127.0.0.1:30010 --run 20261129-101500-ab12cd --json`
    """
    _request("add", url, config, sets, run, json_out)


@servers.command("remove")
def remove(url: UrlArg, run: RunArg = None, config: ConfigOpt = None, sets: SetOpt = None, json_out: JsonOpt = False) -> None:
    """Take an inference server out of a running run: no new requests go to it (stop it with SIGTERM
    afterwards and it hands its requests in flight back, which the run finishes elsewhere).

    Examples:

    * `agentrl run servers remove http://10.0.0.7:30000`
    """
    _request("remove", url, config, sets, run, json_out)


@servers.command("list")
def list_command(run: RunArg = None, config: ConfigOpt = None, sets: SetOpt = None, json_out: JsonOpt = False) -> None:
    """List what a running run's supervisor watches: each component, its URL, status and restarts,
    the servers in rotation and the requests not applied yet.

    Examples:

    * `agentrl run servers list`

    * `agentrl run servers list --run 20261129-101500-ab12cd --json`
    """
    from agentrl_cli.run.supervise.control import read_requests, read_status

    control = control_dir(config, sets, run)
    status = read_status(control) or {}
    requests = read_requests(control)
    known = {c.get("url") for c in status.get("components", [])}
    pending = {"add": [u for u in requests["add"] if u not in known],
               "remove": [u for u in requests["remove"] if u in known]}
    if json_out:
        print_json({"control": str(control), **status, "pending": pending})
        return
    table = Table("component", "url", "kind", "status", "restarts")
    for c in status.get("components", []):
        table.add_row(c.get("component", "?"), c.get("url", "?"), c.get("kind", "?"), c.get("status", "?"),
                      str(c.get("restarts", 0)))
    out().print(table)
    out().print(f"in rotation: {', '.join(status.get('rotation', [])) or 'none'}; weight version "
                f"{status.get('weight_version')}; updated {status.get('updated', '?')}", markup=False)
    for action, urls in pending.items():
        if urls:
            out().print(f"requested, not applied yet ({action}): {', '.join(urls)}", markup=False)
