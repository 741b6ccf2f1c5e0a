"""`agentrl controlplane serve|status|render|validate`: run an instance, show the leader, render and check manifests."""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from agentrl_cli.cli.commands.common import ConfigOpt, JsonOpt, SetOpt, load, out, print_json
from agentrl_cli.ops.controlplane.service import ControlPlane, job_counts, open_store
from agentrl_cli.ops.controlplane.store import LEASE_NAME
from agentrl_cli.core.errors import EXIT_CHECK_FAILED, UsageError

app = typer.Typer(help="The control plane: leader-elected instances over the state store, and the cluster manifests.",
                  no_args_is_help=True)


@app.command("serve")
def serve(
    config: ConfigOpt = None,
    sets: SetOpt = None,
    lease_name: Annotated[str, typer.Option("--lease-name", help="Lease to contend for (stage 3 uses a probe lease).",
                                            hidden=True)] = LEASE_NAME,
    no_dispatch: Annotated[bool, typer.Option("--no-dispatch", help="Hold the lease only; hand no jobs to the executor.",
                                              hidden=True)] = False,
    json_out: JsonOpt = False,
) -> None:
    """Run one control-plane instance until SIGTERM/Ctrl-C: leader or follower over `controlplane.state_store`.

    Start two (on two hosts, or two terminals) for failover: the leader renews its lease every
    lease/3 seconds and hands queued jobs to the executor; a follower takes over when the lease runs
    out. Each leadership change is printed (one JSON line each with --json). With `controlplane.port`
    set, GET /health on `controlplane.host`:`controlplane.port` answers 200 while the instance reaches the store.

    Examples:

    * `agentrl controlplane serve`

    * `agentrl controlplane serve --set controlplane.state_store=postgresql://agentrl@db:5432/agentrl --json`
    """
    loaded = load(config, sets)
    cfg = loaded.config
    store = open_store(cfg)
    executor = None
    if not no_dispatch:
        from agentrl_cli.ops.controlplane.executors import executor_from_config
        executor = executor_from_config(cfg)
        executor.check()
    cp = ControlPlane(cfg, store, executor if executor is not None else _NoExecutor(), lease_name=lease_name,
                      dispatch=not no_dispatch)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    def changed(state) -> None:
        event = {"instance": cp.instance_id, "leader": state.leader, "term": state.term, "holder": state.holder}
        if json_out:
            typer.echo(json.dumps(event))
        else:
            role = "leader" if state.leader else f"follower of {state.holder}"
            typer.echo(f"{cp.instance_id}: {role} (term {state.term})")

    health = None
    if cfg.controlplane.port:
        from agentrl_cli.ops.controlplane.health import create_app
        from agentrl_cli.core.serving import ServerThread

        health = ServerThread(create_app(cp), cfg.controlplane.host, cfg.controlplane.port, name="control-plane health",
                              allow_non_loopback=True).start()
    if not json_out:
        typer.echo(f"control plane {cp.instance_id} on {store.display_url}, executor {cfg.controlplane.executor}, "
                   f"lease {cfg.controlplane.lease_seconds:g} s" + (f", health on {health.url}/health" if health else ""),
                   err=True)
    try:
        cp.serve(stop, changed)
    finally:
        if health is not None:
            health.stop()
        store.close()


class _NoExecutor:
    name = "none"


@app.command("status")
def status(config: ConfigOpt = None, sets: SetOpt = None, json_out: JsonOpt = False) -> None:
    """Show the leader, its term, the lease time left and the followers; exit 1 when no leader is live.

    Examples:

    * `agentrl controlplane status`

    * `agentrl controlplane status --json`
    """
    loaded = load(config, sets)
    cfg = loaded.config
    with open_store(cfg) as store:
        from agentrl_cli.ops.controlplane.lease import cluster_view
        view = cluster_view(store, cfg.controlplane.lease_seconds)
        view = {"state_store": store.display_url, "schema_version": store.schema_version(),
                "executor": cfg.controlplane.executor, **view, "jobs": job_counts(store)}
    if json_out:
        print_json(view)
    else:
        table = Table("instance", "host", "pid", "role", "last seen")
        for i in view["instances"]:
            table.add_row(i["id"], i["host"], str(i["pid"]), "leader" if i["id"] == view["leader"] else "follower",
                          f"{i['last_seen_s_ago']:.1f} s ago")
        out().print(table)
        typer.echo(f"leader: {view['leader'] or 'none'} · term {view['term']} · lease left {view['lease_expires_in_s']:.1f} s · "
                   f"store {view['state_store']}")
        typer.echo("jobs: " + (", ".join(f"{n} {state}" for state, n in sorted(view["jobs"].items())) or "none"))
    if not view["leader"]:
        if not json_out:
            typer.echo("no live leader: start one with `agentrl controlplane serve`", err=True)
        raise typer.Exit(EXIT_CHECK_FAILED)


@app.command("render")
def render(
    executor: Annotated[Optional[str], typer.Option("--executor", help="kubernetes (default) or slurm.")] = None,
    out_dir: Annotated[Optional[Path], typer.Option("--out", help="Write one YAML file per object here instead of stdout.",
                                                    file_okay=False)] = None,
    config: ConfigOpt = None,
    sets: SetOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Render what the cluster needs for the configured pools and priorities, validated offline.

    kubernetes: Namespaces (restricted Pod Security; the sandbox's own), ServiceAccounts and RBAC per role,
    Kueue ResourceFlavor/ClusterQueue/LocalQueue per pool, WorkloadPriorityClass per priority,
    NetworkPolicies, a Service per server, the control-plane, reward and gateway Deployments, the sandbox
    StatefulSet with a headless Service naming each replica,
    a Job per pool and a training JobSet, running the images `agentrl image build` tags from
    image.lock_file (else this environment's lock) - each checked against its schema (exit 1 if one fails). slurm: the slurm.conf lines
    (partitions, tiers, preemption, quota licenses; a job may span cluster.nodes nodes), then as `#` comments the ports each node role must open
    between nodes and out, and the paths they must share (the cross-node plan `agentrl plan` prints).

    Examples:

    * `agentrl controlplane render > agentrl-k8s.yaml`

    * `agentrl controlplane render --out manifests/`

    * `agentrl controlplane render --executor slurm`
    """
    from agentrl_cli.ops.controlplane.manifests import render_all, to_yaml
    from agentrl_cli.ops.controlplane.slurm_conf import network_notes, on_slurm, pool_lines
    from agentrl_cli.ops.controlplane.validate import validate_documents

    loaded = load(config, sets)
    cfg = loaded.config
    kind = executor or "kubernetes"
    if kind == "slurm":
        from agentrl_cli.ops.netplan import HOSTS, network_dict

        lines, notes = pool_lines(cfg.controlplane, max_nodes=cfg.cluster.nodes), network_notes(cfg)
        if json_out:
            print_json({"executor": "slurm", "slurm_conf": lines, "notes": notes, "network": network_dict(on_slurm(cfg), HOSTS)})
        else:
            typer.echo("\n".join(lines + notes))
        return
    if kind != "kubernetes":
        raise UsageError(f"cannot render for executor {kind!r}", "use --executor kubernetes or --executor slurm")
    docs = render_all(cfg)
    errors = validate_documents(docs)
    files = []
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        for n, doc in enumerate(docs):
            path = out_dir / f"{n:02d}-{doc['kind'].lower()}-{doc['metadata']['name']}.yaml"
            path.write_text(to_yaml([doc]), encoding="utf-8")
            files.append(str(path))
    if json_out:
        print_json({"executor": "kubernetes", "valid": not errors, "errors": errors, "files": files, "objects": docs})
    elif out_dir is None:
        typer.echo(to_yaml(docs), nl=False)
    else:
        typer.echo(f"wrote {len(files)} files to {out_dir}")
    if errors:
        for e in errors[:20]:
            typer.echo(f"invalid: {e}", err=True)
        typer.echo("fix the config values named above (controlplane.pools, controlplane.priorities, cluster.*)", err=True)
        raise typer.Exit(EXIT_CHECK_FAILED)


@app.command("validate")
def validate(
    paths: Annotated[list[Path], typer.Argument(help="YAML manifest files (several documents each).")],
    json_out: JsonOpt = False,
) -> None:
    """Validate manifests offline against the shipped Kubernetes, Kueue v1beta2 and JobSet schemas; exit 1 if one fails.

    Examples:

    * `agentrl controlplane validate manifests/*.yaml`

    * `agentrl controlplane validate job.yaml --json`
    """
    from agentrl_cli.ops.controlplane.validate import load_manifest_files, validate_documents

    docs = load_manifest_files(paths)
    errors = validate_documents(docs)
    if json_out:
        print_json({"documents": len(docs), "valid": not errors, "errors": errors})
    else:
        for e in errors:
            typer.echo(f"invalid: {e}")
        typer.echo(f"{len(docs)} document(s), {len(errors)} error(s)")
    if errors:
        if not json_out:
            typer.echo("fix: correct the fields named above (unknown fields are errors; see `agentrl controlplane render`)", err=True)
        raise typer.Exit(EXIT_CHECK_FAILED)
