"""`agentrl plan`: the resource-planning table computed from the config, each line with its formula,
and the cross-node plan (`ops/netplan.py`): the ports each role opens and the paths roles share."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.table import Table

from agentrl_cli.cli.commands.common import ConfigOpt, JsonOpt, SetOpt, load, out, print_json

EXECUTORS = ("local", "slurm", "kubernetes")


def plan_command(
    accelerator_memory_gb: Annotated[float, typer.Option("--accelerator-memory-gb", min=1, help="Memory of one accelerator (GB).")] = 80.0,
    env_host_cpus: Annotated[float, typer.Option("--env-host-cpus", min=1, help="CPU cores of one environment host.")] = 32.0,
    env_host_memory_gb: Annotated[float, typer.Option("--env-host-memory-gb", min=1, help="Memory of one environment host (GB).")] = 128.0,
    step_seconds: Annotated[float, typer.Option("--step-seconds", min=0.001, help="Seconds per trainer step, for storage per day (stage 0's baseline tells).")] = 60.0,
    executor: Annotated[Optional[str], typer.Option("--executor", help="local, slurm or kubernetes: the deployment the network plan describes (default controlplane.executor).", show_default=False)] = None,
    config: ConfigOpt = None,
    sets: SetOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Resource planning from the config: training memory per rank (weights + gradients + optimizer
    state under the ZeRO stage and precision) and the data-parallel size that fits; inference memory
    (weights + KV cache at model.context_length and the episodes per server); environment cores,
    memory and hosts (concurrency x harness cpu/memory); checkpoint and trajectory storage per day.
    Every line shows its formula and inputs.

    Then the network plan: each port a role listens on, who connects and why (rendezvous,
    collectives, weight-sync store, HTTP API, health), its reach (loopback, between nodes, out of the
    cluster) and the config key that sets it; and the paths roles write and read, marking those that
    must be shared between hosts. The NetworkPolicies (`agentrl controlplane render`) and the Slurm
    notes (`agentrl controlplane render --executor slurm`) are rendered from the same list.

    Examples:

    * `agentrl plan`

    * `agentrl plan --set model.path=/models/Qwen2.5-7B-Instruct --set training.precision=bf16 --accelerator-memory-gb 80`

    * `agentrl plan --executor kubernetes --set cluster.nodes=2 --set training.world_size=16`

    * `agentrl plan --step-seconds 45 --json`
    """
    from agentrl_cli.core.errors import UsageError
    from agentrl_cli.ops.netplan import layout_of, network_dict
    from agentrl_cli.ops.plan import PlanInputs, build_plan, model_shape, plan_dict

    if executor is not None and executor not in EXECUTORS:
        raise UsageError(f"unknown executor {executor!r}", f"use --executor {', --executor '.join(EXECUTORS)}")
    cfg = load(config, sets).config
    if executor is not None:
        cfg = cfg.model_copy(update={"controlplane": cfg.controlplane.model_copy(update={"executor": executor})})
    inputs = PlanInputs(accelerator_memory_gb=accelerator_memory_gb, env_host_cpus=env_host_cpus,
                        env_host_memory_gb=env_host_memory_gb, step_seconds=step_seconds)
    shape = model_shape(cfg.model)
    lines = build_plan(cfg, shape, inputs)
    network = network_dict(cfg, layout_of(cfg))
    if json_out:
        print_json({**plan_dict(shape, lines, inputs), "network": network})
        return
    t = Table("area", "item", "value", "unit", "formula", title=f"resource plan: {shape.source}, {shape.params:,} parameters",
              title_justify="left")
    t.columns[4].overflow = "fold"
    for ln in lines:
        t.add_row(ln.area, ln.item, f"{ln.value:.4g}", ln.unit, ln.formula)
    out().print(t)
    _print_network(network)


def _print_network(network: dict) -> None:
    reach = {"loopback": "this host", "cluster": "between nodes", "outside": "out"}
    t = Table("listener", "ports", "from", "reach", "for", "key", "note",
              title=f"network plan ({network['layout']}): ports each role opens; {network['ephemeral']}", title_justify="left")
    t.columns[6].overflow = "fold"
    for o in network["openings"]:
        t.add_row(o["listener"], f"{o['protocol']} {o['ports']}", ", ".join(o["clients"]) or "-", reach[o["reach"]],
                  o["purpose"], o["key"] or "-", o["note"])
    out().print(t)
    p = Table("path", "what", "writers", "readers", "shared", "key", "note", title="paths", title_justify="left")
    p.columns[6].overflow = "fold"
    for s in network["paths"]:
        p.add_row(s["path"], s["what"], ", ".join(s["writers"]) or "-", ", ".join(s["readers"]), "yes" if s["shared"] else "no",
                  s["key"], s["note"])
    out().print(p)
    for w in network["warnings"]:
        out().print(f"warning: {w}", markup=False)
