"""`agentrl job submit|list|show|cancel|logs`: jobs in the registry, run by the configured executor."""

from __future__ import annotations

import time
from typing import Annotated, Optional

import typer
from rich.table import Table

from agentrl_cli.cli.commands.common import ConfigOpt, JsonOpt, SetOpt, err, load, out, print_json
from agentrl_cli.ops.controlplane.executor import FINISHED, SUCCEEDED, pool_named, priority_value
from agentrl_cli.ops.controlplane.executors import executor_from_config
from agentrl_cli.ops.controlplane.registry import Registry, spec_of
from agentrl_cli.ops.controlplane.service import advance_once, open_store, wait_for
from agentrl_cli.core.errors import EXIT_CHECK_FAILED, UsageError

app = typer.Typer(help="Submit jobs to a pool and follow them (executor: controlplane.executor).", no_args_is_help=True)

JobArg = Annotated[str, typer.Argument(help="Job id (from `agentrl job list`).")]


def _context(config, sets):
    cfg = load(config, sets).config
    store = open_store(cfg)
    executor = executor_from_config(cfg)
    executor.check()
    return cfg, store, executor


def _audit(cfg, action: str) -> None:
    """A control-plane write made straight to the state store: one audit line (no key was needed; the
    client is this host's user)."""
    import getpass

    from agentrl_cli.core.security.audit import AuditLog

    AuditLog.from_config(cfg, "controlplane").record(key_id=None, method="CLI", endpoint=f"job {action}", status=200,
                                                     client=f"local:{getpass.getuser()}")


def _row(job: dict) -> dict:
    keep = ("id", "pool", "priority", "state", "reason", "executor", "external_id", "exit_code", "restarts", "nodes", "command",
            "log_path", "submitted_at", "started_at", "ended_at", "fence")
    return {k: job.get(k) for k in keep}


@app.command("submit", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def submit(
    ctx: typer.Context,
    pool: Annotated[str, typer.Option("--pool", help="Pool to run in (controlplane.pools).")],
    priority: Annotated[Optional[str], typer.Option("--priority", help="Priority class (controlplane.priorities; default: the lowest).")] = None,
    cpus: Annotated[int, typer.Option("--cpus", min=1, help="CPUs the job needs.")] = 1,
    training: Annotated[bool, typer.Option("--training", help="The training job: it spans cluster.nodes nodes (Slurm: "
                                           "sbatch --nodes=cluster.nodes; the command runs on the first, `srun` reaches all).")] = False,
    wait: Annotated[bool, typer.Option("--wait", help="Wait until the job finishes; exit 1 unless it succeeded.")] = False,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds --wait waits at most.")] = 3600.0,
    config: ConfigOpt = None,
    sets: SetOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Submit COMMAND (everything after `--`) to a pool; print the job id.

    Examples:

    * `agentrl job submit --pool rollout -- echo hello`

    * `agentrl job submit --pool train --priority high --wait -- agentrl stage run 8`

    * `agentrl job submit --pool rollout --json -- sleep 60`

    * `agentrl job submit --pool train --training --set controlplane.executor=slurm --set cluster.nodes=2 -- srun hostname`
    """
    command = list(ctx.args)
    if not command:
        raise UsageError("no command to run", "put the command after `--`: agentrl job submit --pool rollout -- echo hello")
    cfg = load(config, sets).config
    capacity = pool_named(cfg.controlplane, pool).capacity
    if cpus > capacity:
        raise UsageError(f"--cpus {cpus} is more than pool {pool} has ({capacity})",
                         f"ask for at most {capacity}, or raise the pool's capacity (controlplane.pools)")
    name, value = priority_value(cfg.controlplane, priority)
    nodes = cfg.cluster.nodes if training else 1
    if nodes > 1 and cfg.controlplane.executor != "slurm":
        raise UsageError(f"--training spans cluster.nodes={nodes} nodes, and only the slurm executor places one job on "
                         f"several nodes (controlplane.executor is {cfg.controlplane.executor})",
                         "set controlplane.executor: slurm; on Kubernetes apply the training JobSet "
                         "`agentrl controlplane render` writes; or set cluster.nodes: 1")
    cfg, store, executor = _context(config, sets)
    registry = Registry(store)
    job = registry.submit_job(pool, name, value, command, cpus, cfg.controlplane.executor, cfg.controlplane.jobs_dir, nodes)
    _audit(cfg, "submit")
    advance_once(cfg, store, executor)
    job = registry.job(job["id"])
    if wait:
        job = wait_for(registry, job["id"], lambda j: j["state"] in FINISHED, timeout,
                       tick=lambda: advance_once(cfg, store, executor), interval_s=0.5)
    store.close()
    if json_out:
        print_json(_row(job))
    else:
        typer.echo(job["id"])
        err().print(f"{job['state']}{': ' + job['reason'] if job['reason'] else ''} · pool {job['pool']} · priority {job['priority']}")
    if wait and job["state"] != SUCCEEDED:
        raise typer.Exit(EXIT_CHECK_FAILED)


@app.command("list")
def list_command(
    all_jobs: Annotated[bool, typer.Option("--all", help="Include finished jobs.")] = False,
    config: ConfigOpt = None, sets: SetOpt = None, json_out: JsonOpt = False,
) -> None:
    """List jobs, newest first, with state and the reason a job waits.

    Examples:

    * `agentrl job list`

    * `agentrl job list --all --json`
    """
    cfg, store, executor = _context(config, sets)
    advance_once(cfg, store, executor)
    jobs = [j for j in Registry(store).jobs() if all_jobs or j["state"] not in FINISHED]
    store.close()
    if json_out:
        print_json([_row(j) for j in jobs])
        return
    table = Table()
    table.add_column("job", no_wrap=True)
    for name in ("pool", "priority", "state", "reason", "command"):
        table.add_column(name)
    for j in jobs:
        table.add_row(j["id"], j["pool"], j["priority"], j["state"], j["reason"] or "", " ".join(j["command"])[:60])
    out().print(table)


@app.command("show")
def show(job_id: JobArg, config: ConfigOpt = None, sets: SetOpt = None, json_out: JsonOpt = False) -> None:
    """Show one job: pool, priority, state, why it waits or ended, exit code, restarts, times.

    Examples:

    * `agentrl job show j20261201120000-ab12cd`

    * `agentrl job show j20261201120000-ab12cd --json`
    """
    cfg, store, executor = _context(config, sets)
    advance_once(cfg, store, executor)
    job = _row(Registry(store).job(job_id))
    store.close()
    if json_out:
        print_json(job)
        return
    for k, v in job.items():
        if v not in (None, ""):
            typer.echo(f"{k:>13}: {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(v)) if k.endswith('_at') else v}")


@app.command("cancel")
def cancel(job_id: JobArg, config: ConfigOpt = None, sets: SetOpt = None, json_out: JsonOpt = False) -> None:
    """Ask for a job to be cancelled (the leader cancels it at the scheduler).

    Examples:

    * `agentrl job cancel j20261201120000-ab12cd`

    * `agentrl job cancel j20261201120000-ab12cd --json`
    """
    cfg, store, executor = _context(config, sets)
    registry = Registry(store)
    registry.request_cancel(job_id)
    _audit(cfg, "cancel")
    job = wait_for(registry, job_id, lambda j: j["state"] in FINISHED, 30.0, tick=lambda: advance_once(cfg, store, executor))
    store.close()
    print_json(_row(job)) if json_out else typer.echo(f"{job_id}: {job['state']}")


@app.command("logs")
def logs(job_id: JobArg, config: ConfigOpt = None, sets: SetOpt = None, json_out: JsonOpt = False) -> None:
    """Print a job's output (stdout and stderr together).

    Examples:

    * `agentrl job logs j20261201120000-ab12cd`

    * `agentrl job logs j20261201120000-ab12cd --json`
    """
    cfg, store, executor = _context(config, sets)
    advance_once(cfg, store, executor)
    job = Registry(store).job(job_id)
    store.close()
    text = executor.logs(job["external_id"], spec_of(job)) if job["external_id"] else ""
    if json_out:
        print_json({"id": job_id, "state": job["state"], "log": text})
    else:
        typer.echo(text, nl=False)
        if not text:
            typer.echo(f"(no output yet; the job is {job['state']})", err=True)
