"""`agentrl sandbox run|check|reclaim`: run one command in a fresh sandbox as a harness would; show
what isolation this host provides; remove sandboxes left by processes that died."""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import Annotated, Optional

import typer

from agentrl_cli.cli.commands.common import ConfigOpt, JsonOpt, SetOpt, err, load, print_json
from agentrl_cli.envs.sandbox import Sandbox, SandboxSettings
from agentrl_cli.envs.sandbox.bwrap import check_bwrap
from agentrl_cli.envs.sandbox.cgroups import cgroup_support
from agentrl_cli.envs.sandbox.seccomp import bpf_program

app = typer.Typer(help="Run commands in sandboxes and check the isolation this host provides.", no_args_is_help=True)

EXIT_TIMEOUT = 124


@app.command("run", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run(
    command: Annotated[list[str], typer.Argument(help="The command and its arguments (after --).")],
    timeout: Annotated[Optional[float], typer.Option("--timeout", help="Wall-clock limit in seconds (default sandbox.wall_timeout_s).")] = None,
    memory_mb: Annotated[Optional[int], typer.Option("--memory-mb", help="Memory limit (default sandbox.memory_mb).")] = None,
    cpu_s: Annotated[Optional[int], typer.Option("--cpu-s", help="CPU-time limit (default sandbox.cpu_time_s).")] = None,
    stdin: Annotated[bool, typer.Option("--stdin", help="Pass this command's standard input to the sandboxed command.")] = False,
    image: Annotated[str, typer.Option("--image", help="Run in this image as the read-only root: oci:PATH[:TAG], oci-archive:FILE[:TAG], docker-archive:FILE[:TAG] or dir:PATH (default: the host's system).")] = "",
    config: ConfigOpt = None,
    sets: SetOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Run one command in a fresh sandbox exactly as a harness would; print its output and status and
    exit with its exit code (124 on timeout). A string with spaces runs under bash -c.

    Examples:

    * `agentrl sandbox run -- python3 -c "print(1 + 1)"`

    * `agentrl sandbox run --timeout 2 -- sleep 10`   (exits 124)

    * `agentrl sandbox run --memory-mb 64 -- python3 -c "x = bytearray(1 << 30)"`

    * `agentrl sandbox run --image oci:./debian-layout:bookworm -- cat /etc/os-release`
    """
    loaded = load(config, sets)
    settings = SandboxSettings.from_config(loaded.config.sandbox)
    settings = replace(settings, limits=settings.limits.with_(memory_mb=memory_mb, cpu_time_s=cpu_s, wall_timeout_s=timeout))
    settings = settings.with_image(image)
    argv = ["/bin/bash", "-c", command[0]] if len(command) == 1 and " " in command[0] else command
    data = sys.stdin.read() if stdin else None
    with Sandbox(settings) as sb:
        info = sb.describe()
        if not sb.isolated:
            err().print("[bold red]WARNING: sandbox.backend is 'process': this command runs WITHOUT isolation[/]")
        result = sb.exec(argv, stdin=data)
    code = EXIT_TIMEOUT if result.timed_out else (result.exit_code if result.exit_code is not None else 1)
    if json_out:
        print_json({**result.to_dict(), "sandbox": info, "exit": code})
        raise typer.Exit(code)
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    flags = [f"status={result.status}", f"exit={result.exit_code}", f"{result.duration_s:.3f}s", f"cpu={result.cpu_s:.3f}s"]
    if result.killed_reason:
        flags.append(f"stopped by {result.killed_reason}")
    if result.truncated:
        flags.append("output truncated")
    if result.limits_hit:
        flags.append(f"limits hit {result.limits_hit}")
    err().print("sandbox: " + " ".join(flags) + f"  [{info['backend']}, seccomp {info['seccomp']}, cgroups {info['cgroups']}]", markup=False)
    raise typer.Exit(code)


@app.command("check")
def check(config: ConfigOpt = None, sets: SetOpt = None, json_out: JsonOpt = False) -> None:
    """Show what isolation this host provides: bubblewrap and namespaces, seccomp, cgroups.
    Exit 0 when bubblewrap works, 2 (with the fix) when it does not.

    Examples:

    * `agentrl sandbox check`

    * `agentrl sandbox check --json`
    """
    loaded = load(config, sets)
    c = loaded.config.sandbox
    facts = {"backend": c.backend, "bwrap": check_bwrap(c.bwrap) if c.backend == "bwrap" else "not used",
             "namespaces": "user, pid, ipc, net, uts, cgroup" if c.backend == "bwrap" else "none",
             "seccomp": bpf_program()[1] if c.seccomp else "disabled (sandbox.seccomp: false)",
             "cgroups": cgroup_support()}
    if json_out:
        print_json(facts)
        return
    for k, v in facts.items():
        typer.echo(f"{k:11} {v}")


@app.command("reclaim")
def reclaim(config: ConfigOpt = None, sets: SetOpt = None, json_out: JsonOpt = False) -> None:
    """Remove sandboxes left by processes that died without closing them (their tmpfs mounts,
    cgroups, processes and work directories under `sandbox.root_dir`), and the simulated nodes a
    killed rehearsal left (its network namespaces, with their veths and bridge, its processes, its
    mount points and files). What a live process owns is never touched; every training run reclaims
    sandboxes when it starts.

    Examples:

    * `agentrl sandbox reclaim`

    * `agentrl sandbox reclaim --json`
    """
    from pathlib import Path

    from agentrl_cli.envs.sandbox.orphans import reclaim_orphans
    from agentrl_cli.ops.rehearse.leftovers import reclaim as reclaim_rehearsals

    loaded = load(config, sets)
    counts = reclaim_orphans(Path(loaded.config.sandbox.root_dir).expanduser())
    rehearsal = reclaim_rehearsals()
    if json_out:
        print_json({**counts, "rehearsal": rehearsal})
        return
    typer.echo(f"reclaimed {counts['sandboxes']} sandboxes: {counts['mounts']} tmpfs mounts, {counts['cgroups']} cgroups, "
               f"{counts['processes']} processes" + (f"; {counts['errors']} could not be removed" if counts["errors"] else ""))
    typer.echo(f"reclaimed {rehearsal['runs']} rehearsal runs: {rehearsal['namespaces']} network namespaces, "
               f"{rehearsal['processes']} processes, {rehearsal['dirs']} directories"
               + (f"; {rehearsal['errors']} could not be removed" if rehearsal["errors"] else ""))
    if "unavailable" in rehearsal:
        err().print(f"rehearsal leftovers remain: {rehearsal['unavailable']}", markup=False)
