"""The `agentrl` command line: a Typer root with one sub-app per command group, and the one table
that maps exceptions to a message, a fix and an exit code (0 pass, 1 a check failed, 2 usage or
config error). AGENTRL_DEBUG=1 shows tracebacks.

Command modules load on first use (`COMMANDS`): `agentrl --help` and a light command import only
what they need, never torch, DeepSpeed or transformers. A mistyped command or option, or a missing
argument, is a usage error: the group's usage line, the closest match, exit 2.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback

import typer
from typer import _click as typer_click  # Typer's own Click: its parsing errors are of these types
from typer.core import TyperCommand, TyperGroup

from agentrl_cli import __version__
from agentrl_cli.core.errors import EXIT_CHECK_FAILED, EXIT_USAGE, AgentrlError

# exception type -> (exit code, message prefix, fix). AgentrlError carries its own message and fix.
ERROR_TABLE: dict[type[BaseException], tuple[int, str, str]] = {
    PermissionError: (EXIT_USAGE, "permission denied", "check the path's permissions, or choose another with --config / observe.runs_dir"),
    FileNotFoundError: (EXIT_USAGE, "file not found", "check the path"),
    OSError: (EXIT_CHECK_FAILED, "system error", "check disk space and permissions; AGENTRL_DEBUG=1 shows the traceback"),
}

# Exceptions that Click/Typer turn into their own message and exit code (usage errors exit 2).
PASSTHROUGH = (typer.Exit, typer.Abort, typer_click.exceptions.ClickException)

# name -> (module, attribute, "group" for a Typer sub-app | "command" for a function, one-line help).
# The help lines are what `agentrl --help` lists without importing the modules; a test keeps them
# in step with the commands' own help.
COMMANDS: dict[str, tuple[str, str, str, str]] = {
    "init": ("agentrl_cli.cli.commands.init", "init", "command",
             "Write a starter config (agentrl.yaml) with every key, its meaning and its CPU-box default."),
    "config": ("agentrl_cli.cli.commands.config", "app", "group", "Show and validate the resolved configuration."),
    "stage": ("agentrl_cli.cli.commands.stage", "app", "group", "Run the stage runbook (0..8) and read its reports."),
    "verify": ("agentrl_cli.cli.commands.verify", "verify_command", "command",
               "Four-layer acceptance: connectivity, correctness, performance vs the stage-0 baseline, "
               "small-sample convergence, and cross-harness."),
    "eval": ("agentrl_cli.cli.commands.eval", "eval_command", "command",
             "Evaluate a model or a run's checkpoint: greedy success and pass@k per harness and task family, resumable."),
    "troubleshoot": ("agentrl_cli.cli.commands.troubleshoot", "troubleshoot", "command",
                     "Look a symptom up: causes, how to check, what to do; or diagnose a run."),
    "report": ("agentrl_cli.cli.commands.report", "report_command", "command",
               "Write a run's HTML report (plots, evaluation table, stage and verify reports) and summarise it."),
    "runs": ("agentrl_cli.cli.commands.runs", "app", "group", "List and inspect runs (runs/<run_id>/)."),
    "run": ("agentrl_cli.cli.commands.run_servers", "app", "group",
            "Act on a running training run: add and remove its inference servers, list them."),
    "harness": ("agentrl_cli.cli.commands.harness", "app", "group",
                "Check a harness against the contract without a model; list the registered ones."),
    "sandbox": ("agentrl_cli.cli.commands.sandbox", "app", "group",
                "Run commands in sandboxes and check the isolation this host provides."),
    "serve": ("agentrl_cli.cli.commands.serve", "app", "group",
              "Run platform services: the sandbox pool, inference servers, the reward service, a harness as an OpenEnv environment."),
    "model": ("agentrl_cli.cli.commands.model", "app", "group",
              "Build the built-in tiny model, import a model (GGUF, package, directory), warm-start one on a harness's "
              "scripted solutions, show what model.path resolves to."),
    "data": ("agentrl_cli.cli.commands.data", "app", "group",
             "Query, measure and clean the trajectory store (data.store: local or s3)."),
    "observe": ("agentrl_cli.cli.commands.observe", "app", "group",
                "Monitoring of runs: Prometheus alert rules for what troubleshoot --run detects."),
    "replay": ("agentrl_cli.cli.commands.replay", "replay_command", "command",
               "Rebuild the harness at the recorded version with the recorded task and seed, replay the "
               "recorded actions and compare every observation; exit 1 with a diff at the first divergence."),
    "rehearse": ("agentrl_cli.cli.commands.rehearse", "rehearse_command", "command",
                 "Rehearse the deployment before applying it: bring up each role on a simulated node of this machine"),
    "bench": ("agentrl_cli.cli.commands.bench", "app", "group",
              "Measure collectives, checkpoint storage and the object store (stage 1's checks, one at a time)."),
    "engine": ("agentrl_cli.cli.commands.engine", "app", "group",
               "Check agentrl's requests against an inference engine's own code (`agentrl engine verify`)."),
    "image": ("agentrl_cli.cli.commands.image", "app", "group",
              "Lock exact versions per role, render Dockerfiles, verify this environment, build images."),
    "plan": ("agentrl_cli.cli.commands.plan", "plan_command", "command",
             "Resource planning from the config: training memory per rank, inference memory, environment "
             "cores and hosts, and storage per day."),
    "controlplane": ("agentrl_cli.cli.commands.controlplane", "app", "group",
                     "The control plane: leader-elected instances over the state store, and the cluster manifests."),
    "job": ("agentrl_cli.cli.commands.job", "app", "group",
            "Submit jobs to a pool and follow them (executor: controlplane.executor)."),
    "chaos": ("agentrl_cli.cli.commands.chaos", "chaos_command", "command",
              "Train a short stage 8 run while injecting faults, and report how each fault was seen and recovered and what was lost."),
    "secrets": ("agentrl_cli.cli.commands.secrets", "app", "group",
                "Make and rotate the bearer keys of the services: key files with one key per line, the first current."),
    "reward": ("agentrl_cli.cli.commands.reward", "app", "group",
               "Train reward models on stored trajectories (served by reward.verifiers: [reward_model])."),
    "select": ("agentrl_cli.cli.commands.select", "select_command", "command",
               "Measure the framework-selection criteria against each installed training backend: a scorecard."),
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


def load_command(name: str) -> typer_click.Command:
    """Import command `name` and build its Click command exactly as `add_typer`/`command` would."""
    module, attr, kind, _ = COMMANDS[name]
    target = getattr(importlib.import_module(module), attr)
    scratch = typer.Typer(rich_markup_mode="markdown", pretty_exceptions_enable=False)
    scratch.callback()(lambda: None)  # a callback makes the scratch app a group, as the root is
    if kind == "group":
        scratch.add_typer(target, name=name)
    else:
        scratch.command(name)(target)
    return typer.main.get_group(scratch).commands[name]


class AgentrlGroup(TyperGroup):
    """Root group: loads command modules on first use, and turns known exceptions into one-screen
    messages with exit codes."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.lazy = {name: spec for name, spec in COMMANDS.items() if name not in self.commands}
        for name in self.lazy:
            self.commands[name] = TyperCommand(name, help=self.lazy[name][3])  # listed in help, loaded on use

    def load(self, name: str) -> typer_click.Command | None:
        if name in self.lazy:
            self.commands[name] = load_command(name)
            del self.lazy[name]
        return self.commands.get(name)

    def resolve_command(self, ctx, args):
        if args and args[0] in self.lazy:
            return args[0], self.load(args[0]), args[1:]
        return super().resolve_command(ctx, args)

    def invoke(self, ctx: typer_click.Context):
        try:
            return super().invoke(ctx)
        except PASSTHROUGH:
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


# Commands registered here directly (not through COMMANDS) load with the app.


def main() -> None:
    app()
