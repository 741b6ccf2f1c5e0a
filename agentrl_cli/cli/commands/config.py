"""`agentrl config show|validate`."""

from __future__ import annotations

from typing import Annotated

import typer
import yaml
from rich.table import Table

from agentrl_cli.cli.commands.common import ConfigOpt, JsonOpt, SetOpt, load, out, print_json
from agentrl_cli.config.explain import describe_keys

app = typer.Typer(help="Show and validate the resolved configuration.", no_args_is_help=True)


@app.command("show")
def show(config: ConfigOpt = None, sets: SetOpt = None, json_out: JsonOpt = False,
         describe: Annotated[bool, typer.Option("--describe", help="List every key with allowed values, meaning and default.")] = False) -> None:
    """Print the resolved config (defaults < file < AGENTRL_SECTION__KEY env < --set); secrets masked:
    secret keys, values of keys named like secrets (a harness option `api_token`), a password in a
    URL, and anything that reads as a credential.

    Examples:

    * `agentrl config show`

    * `agentrl config show --set rollout.concurrency=8 --json`

    * `agentrl config show --describe`
    """
    if describe:
        rows = describe_keys()
        if json_out:
            print_json([{"key": k, "allowed": a, "description": d, "default": v} for k, a, d, v in rows])
            return
        table = Table("key", "allowed", "default", "meaning")
        for key, allowed, desc, default in rows:
            table.add_row(key, allowed, repr(default), desc)
        out().print(table)
        return
    from agentrl_cli.core.redaction import SecretRedactor

    loaded = load(config, sets)
    redactor = SecretRedactor.build(loaded.config)
    masked = redactor.config(loaded.resolved())
    if json_out:
        print_json({"source": loaded.source, "config_hash": loaded.hash,
                    "overrides": redactor.strings(loaded.masked_overrides()), "config": masked})
        return
    typer.echo(f"# source: {loaded.source}  hash: {loaded.hash}")
    typer.echo(yaml.safe_dump(masked, sort_keys=False, allow_unicode=True).rstrip())


@app.command("validate")
def validate(config: ConfigOpt = None, sets: SetOpt = None, json_out: JsonOpt = False) -> None:
    """Check the config; exit 0 when valid, 2 with the key path and the fix when not.

    Examples:

    * `agentrl config validate`

    * `agentrl config validate --config cluster.yaml`
    """
    loaded = load(config, sets)
    if json_out:
        print_json({"valid": True, "source": loaded.source, "config_hash": loaded.hash})
    else:
        typer.echo(f"valid: {loaded.source} (hash {loaded.hash})")
