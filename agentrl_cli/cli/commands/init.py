"""`agentrl init`: write agentrl.yaml from templates/platform.yaml."""

from __future__ import annotations

import shutil
from importlib import resources
from pathlib import Path
from typing import Annotated, Optional

import typer

from agentrl_cli.cli.commands.common import JsonOpt, err, print_json
from agentrl_cli.config import DEFAULT_CONFIG_NAME, load_config
from agentrl_cli.core.errors import UsageError


def init(
    config: Annotated[Optional[Path], typer.Option("--config", "-c", help="Where to write the config.", dir_okay=False)] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file (the old one is kept as .bak).")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Write a starter config (agentrl.yaml) with every key, its meaning and its CPU-box default.

    Examples:

    * `agentrl init`

    * `agentrl init --config cluster.yaml --force`
    """
    dest = config or Path(DEFAULT_CONFIG_NAME)
    if dest.exists() and not force:
        raise UsageError(f"{dest} already exists", "pass --force to overwrite it (the old file is kept as "
                                                   f"{dest.name}.bak), or --config OTHER.yaml")
    backup = None
    if dest.exists():
        backup = dest.with_name(dest.name + ".bak")
        shutil.copy2(dest, backup)
    template = resources.files("templates").joinpath("platform.yaml").read_text(encoding="utf-8")
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(template, encoding="utf-8")
    loaded = load_config(dest, [], env={})
    if json_out:
        print_json({"written": str(dest), "backup": str(backup) if backup else None, "config_hash": loaded.hash})
        return
    typer.echo(f"wrote {dest} (config hash {loaded.hash})")
    if backup:
        err().print(f"previous file kept as {backup}")
    err().print("Next: edit it if you like, then `agentrl stage run all`.")
