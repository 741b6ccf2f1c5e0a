"""The `agentrl` command line: a Typer root with one sub-app per command group, and the one table
that maps exceptions to a message, a fix and an exit code (0 pass, 1 a check failed, 2 usage or
config error). AGENTRL_DEBUG=1 shows tracebacks."""

from __future__ import annotations

import os
import sys
import traceback

import click
import typer
from typer.core import TyperGroup

from agentrl_cli import __version__
from agentrl_cli.commands import config as config_cmd
from agentrl_cli.commands import data as data_cmd
from agentrl_cli.commands import model as model_cmd
from agentrl_cli.commands import runs as runs_cmd
from agentrl_cli.commands import sandbox as sandbox_cmd
from agentrl_cli.commands import serve as serve_cmd
from agentrl_cli.commands import stage as stage_cmd
from agentrl_cli.commands.init import init
from agentrl_cli.commands.replay import replay_command
from agentrl_cli.commands.troubleshoot import troubleshoot
from agentrl_cli.commands.verify import verify_command
from agentrl_cli.errors import EXIT_CHECK_FAILED, EXIT_USAGE, AgentrlError

# exception type -> (exit code, message prefix, fix). AgentrlError carries its own message and fix.
ERROR_TABLE: dict[type[BaseException], tuple[int, str, str]] = {
    PermissionError: (EXIT_USAGE, "permission denied", "check the path's permissions, or choose another with --config / observe.runs_dir"),
    FileNotFoundError: (EXIT_USAGE, "file not found", "check the path"),
    OSError: (EXIT_CHECK_FAILED, "system error", "check disk space and permissions; AGENTRL_DEBUG=1 shows the traceback"),
}


def debug_enabled() -> bool:
    return os.environ.get("AGENTRL_DEBUG", "").strip().lower() not in ("", "0", "false", "no")


def _fail(message: str, hint: str, code: int) -> None:
    typer.secho(f"error: {message}", fg="red", err=True)
    if hint:
        typer.echo(f"  fix: {hint}", err=True)
    if debug_enabled():
        traceback.print_exc(file=sys.stderr)
    raise typer.Exit(code)


class AgentrlGroup(TyperGroup):
    """Root group: turns known exceptions into one-screen messages with exit codes."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (typer.Exit, click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except AgentrlError as exc:
            _fail(exc.message, exc.hint, exc.exit_code)
        except KeyboardInterrupt:
            typer.echo("interrupted", err=True)
            raise typer.Exit(130) from None
        except Exception as exc:  # noqa: BLE001
            for kind, (code, prefix, hint) in ERROR_TABLE.items():
                if isinstance(exc, kind):
                    _fail(f"{prefix}: {exc}", hint, code)
            if debug_enabled():
                raise
            _fail(f"internal error: {type(exc).__name__}: {exc}",
                  "this is a bug in agentrl; rerun with AGENTRL_DEBUG=1 and report the traceback", EXIT_CHECK_FAILED)


app = typer.Typer(
    name="agentrl",
    cls=AgentrlGroup,
    help="Bring up an agentic-RL training platform stage by stage and prove every stage works.\n\n"
         "Start with `agentrl init`, then `agentrl stage run all`; `agentrl verify` is the acceptance; "
         "`agentrl troubleshoot SYMPTOM` looks a problem up.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"agentrl {__version__}")
        raise typer.Exit()


@app.callback()
def root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Show the version.")) -> None:
    """agentrl: a runbook, an acceptance and a troubleshooter for agentic-RL training platforms."""


app.command("init")(init)
app.add_typer(config_cmd.app, name="config")
app.add_typer(stage_cmd.app, name="stage")
app.command("verify")(verify_command)
app.command("troubleshoot")(troubleshoot)
app.add_typer(runs_cmd.app, name="runs")
app.add_typer(sandbox_cmd.app, name="sandbox")
app.add_typer(serve_cmd.app, name="serve")
app.add_typer(model_cmd.app, name="model")
app.add_typer(data_cmd.app, name="data")
app.command("replay")(replay_command)


def main() -> None:
    app()
