"""Options shared by every command (`--config`, `--set`, `--json`) and the output helpers:
results on stdout (human or JSON), errors, hints and progress on stderr; the JSON object and the
exit code of a command that ran checks outside the runbook (bench, image)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console

from agentrl_cli.cli.render import ResultConsole
from agentrl_cli.config import LoadedConfig, load_config
from agentrl_cli.core.errors import EXIT_CHECK_FAILED
from agentrl_cli.core.report import Check, CheckStatus, checks_to_json, overall

ConfigOpt = Annotated[Optional[Path], typer.Option(
    "--config", "-c", help="Config file (default: ./agentrl.yaml if present, else the built-in defaults).",
    show_default=False, dir_okay=False)]
SetOpt = Annotated[Optional[list[str]], typer.Option(
    "--set", "-s", help="Override a key: --set rollout.concurrency=8 (repeatable; list items by index: harnesses.0.cpu=2; "
            "a key of an optional section turns it on with its defaults: training.lora.rank=16).",
    show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout instead of tables.")]
RunOpt = Annotated[Optional[str], typer.Option("--run", help="Run id (default: the newest run).", show_default=False)]


def load(config: Path | None, sets: list[str] | None) -> LoadedConfig:
    """The config; from here on this process redacts its secrets from every log record and print, and
    logs at observe.log_level."""
    from agentrl_cli.core.logstreams import configure_logging
    from agentrl_cli.core.redaction import protect_process

    loaded = load_config(config, sets or [])
    protect_process(loaded.config)
    configure_logging(loaded.config.observe.log_level)
    return loaded


def out() -> Console:
    """The console of results (stdout): tables printed through it stay whole off a terminal."""
    return ResultConsole(highlight=False, soft_wrap=False)


def err() -> Console:
    return Console(stderr=True, highlight=False)


def print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, ensure_ascii=False, default=str))


def checks_json(checks: list[Check], **fields) -> dict:
    """The `--json` object of a command that ran checks: its status, `fields`, then the checks."""
    return {"status": overall(checks), **fields, "checks": checks_to_json(checks)}


def finish(checks: list[Check]) -> None:
    """Exit 1 when a check failed (else return: the command exits 0)."""
    if overall(checks) == CheckStatus.FAIL:
        raise typer.Exit(EXIT_CHECK_FAILED)
