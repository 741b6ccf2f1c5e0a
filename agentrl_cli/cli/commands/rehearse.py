"""`agentrl rehearse`: the deployment as rendered, on simulated nodes of this machine (`ops/rehearse/`)."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from agentrl_cli.cli.commands.common import ConfigOpt, JsonOpt, SetOpt, err, load, out, print_json
from agentrl_cli.cli.render import print_table


def rehearse_command(
    subnet: Annotated[str, typer.Option("--subnet", help="The simulated nodes' subnet, inside 198.18.0.0/15 (RFC 2544's benchmarking range).")] = "198.18.0.0/24",
    timeout: Annotated[float, typer.Option("--timeout", min=60, help="Seconds the workload (stage 8 smoke as a job) may take.")] = 1800.0,
    chaos: Annotated[bool, typer.Option("--chaos", help="Node faults while the run trains: inference-1's link cut, the sandbox replica on sandbox-1 killed, every process of inference-0 killed; each undone after --chaos-hold-s and judged recovered within --chaos-bound-s; the ledger checks nothing was lost or stored twice.")] = False,
    chaos_hold_s: Annotated[float, typer.Option("--chaos-hold-s", min=1, help="Seconds each fault lasts before it is undone.")] = 10.0,
    chaos_bound_s: Annotated[float, typer.Option("--chaos-bound-s", min=10, help="Seconds each fault's recovery may take.")] = 180.0,
    out_dir: Annotated[Optional[Path], typer.Option("--dir", help="Where the rehearsal's files go (default: <observe.runs_dir>/rehearsals/<time>).", show_default=False)] = None,
    config: ConfigOpt = None,
    sets: SetOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Rehearse the deployment before applying it: bring up each role on a simulated node of this
    machine (a network namespace with its own hostname and address from 198.18.0.0/15, bridged in a
    namespace of its own, no route out), fence every node with firewall rules generated from the
    plan the NetworkPolicies come from (`agentrl plan`), start the services for real, and run stage 8
    smoke as a control-plane job across them: two trainer nodes (the `deepspeed` launcher's
    multi-node rendezvous on training.master_port), two inference servers behind the SGLang router,
    the sandbox service as two replicas behind HAProxy, the reward service, the gateway, S3 (moto)
    and PostgreSQL each on its node. Then `agentrl verify` on the run, and every connection the rules
    refused, named with the plan entry to add. Everything is torn down at the end; what a killed
    rehearsal left, the next one (or `agentrl sandbox reclaim`) removes.

    Needs root, iproute2, nftables, HAProxy, PostgreSQL, openssh-server and pdsh, sglang-router and
    moto (`bash .ci/setup --dev` installs them). Writes <dir>/report.json and the services' logs;
    exit 0 passed, 1 a check failed, 2 it cannot run here (the message says what to install).

    Examples:

    * `sudo -E agentrl rehearse`

    * `agentrl rehearse --json --set rollout.concurrency=4`

    * `agentrl rehearse --chaos --json`
    """
    from agentrl_cli.acceptance.rehearsal.rehearsal import Options, Rehearsal

    loaded = load(config, sets)
    cfg = loaded.config
    where = out_dir or Path(cfg.observe.runs_dir) / "rehearsals" / time.strftime("%Y%m%d-%H%M%S")
    console = err()
    opts = Options(config=cfg, out_dir=where.absolute(), subnet=subnet, deadline_s=timeout, chaos=chaos,
                   chaos_hold_s=chaos_hold_s, chaos_bound_s=chaos_bound_s,
                   progress=lambda msg: console.print(f"rehearse: {msg}", markup=False, highlight=False))
    def stop(signum, frame):  # SIGTERM as Ctrl-C: the nodes are torn down on the way out
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    report = Rehearsal(opts).run()
    if json_out:
        print_json(report)
    else:
        table = Table("check", "status", "detail")
        for c in report["checks"]:
            table.add_row(c["name"], c["status"], str(c.get("detail") or c.get("hint") or "")[:200])
        print_table(out(), table)
        out().print(f"report: {where / 'report.json'}", markup=False)
    raise typer.Exit(0 if report["ok"] else 1)
