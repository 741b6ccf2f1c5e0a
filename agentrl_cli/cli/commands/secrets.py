"""`agentrl secrets rotate|retire-old|show`: the services' key files (security/keys.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from agentrl_cli.cli.commands.common import JsonOpt, err, print_json
from agentrl_cli.core.errors import UsageError

app = typer.Typer(help="Make and rotate the bearer keys of the services: key files with one key per line, the first current "
                       "and every one accepted, so a rotation keeps the old key valid until you retire it.",
                  no_args_is_help=True)

Target = Annotated[str, typer.Argument(
    help="A key file, or a service (inference, reward, sandbox, gateway, controlplane): the file its "
         "AGENTRL_SERVICE__API_KEY_FILE variable names.", show_default=False)]


def _path(target: str) -> Path:
    from agentrl_cli.core.security.keys import SERVICES, env_file_var

    if target in SERVICES:
        var = env_file_var(target)
        if not os.environ.get(var):
            raise UsageError(f"{var} is not set, so the {target} service has no key file to change",
                             f"name the file itself (`agentrl secrets rotate /path/{target}.key`), or set {var}")
        return Path(os.environ[var])
    return Path(target)


def _report(path: Path, before: list[str] | None, after: list[str], json_out: bool, said: str) -> None:
    if json_out:
        print_json({"file": str(path), "keys": after, "current": after[0]} | ({"before": before} if before is not None else {}))
        return
    typer.echo(f"{path}: {', '.join(after)} (current first)")
    err().print(said, markup=False)


@app.command("rotate")
def rotate(
    target: Target,
    drop_old: Annotated[bool, typer.Option("--drop-old", help="Keep only the new key: clients still sending the old one are refused at once.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Write a new key first in the key file (creating it, readable by its owner only); the key that
    was current stays valid second until `agentrl secrets retire-old`. Servers reading the file
    (`AGENTRL_SANDBOX__API_KEY_FILE` and the like) accept the new key at once; clients send it from
    their next start. Only key ids are printed, never a key.

    Examples:

    * `agentrl secrets rotate /etc/agentrl/sandbox.key`

    * `agentrl secrets rotate sandbox` (the file AGENTRL_SANDBOX__API_KEY_FILE names)

    * `agentrl secrets rotate reward.key --drop-old --json`
    """
    from agentrl_cli.core.security.keys import rotate as rotate_file

    path = _path(target)
    before, after = rotate_file(path, keep_old=not drop_old)
    if len(after) > 1:
        said = (f"new key {after[0]} is current; {after[1]} stays valid until `agentrl secrets retire-old {target}` "
                "(run it once every client has restarted with the new key)")
    else:
        said = f"new key {after[0]} is the only valid one" + (f"; {', '.join(before)} no longer" if before else "")
    _report(path, before, after, json_out, said)


@app.command("retire-old")
def retire_old(target: Target, json_out: JsonOpt = False) -> None:
    """Keep only the current (first) key of the key file: requests with the old key get 401 from now on.

    Examples:

    * `agentrl secrets retire-old /etc/agentrl/sandbox.key`

    * `agentrl secrets retire-old sandbox --json`
    """
    from agentrl_cli.core.security.keys import retire_old as retire_file

    path = _path(target)
    before, after = retire_file(path)
    dropped = [k for k in before if k not in after]
    _report(path, before, after, json_out,
            f"{', '.join(dropped)} no longer valid; {after[0]} is" if dropped else f"only {after[0]} was valid; nothing changed")


@app.command("show")
def show(target: Target, json_out: JsonOpt = False) -> None:
    """List the ids of the keys in the key file, current first (the ids audit lines carry; never a key).

    Examples:

    * `agentrl secrets show /etc/agentrl/sandbox.key`

    * `agentrl secrets show gateway --json`
    """
    from agentrl_cli.core.errors import NotFoundError
    from agentrl_cli.core.security.keys import key_id, read_key_file

    path = _path(target)
    ids = [key_id(k) for k in read_key_file(path)]
    if not ids:
        raise NotFoundError(f"no key in {path}", f"write one with `agentrl secrets rotate {target}`")
    _report(path, None, ids, json_out, f"{len(ids)} valid key{'s' if len(ids) > 1 else ''}; clients send {ids[0]}")
