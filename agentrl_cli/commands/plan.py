"""`agentrl plan`: the resource-planning table computed from the config, each line with its formula."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from agentrl_cli.commands.common import ConfigOpt, JsonOpt, SetOpt, load, out, print_json


def plan_command(
    accelerator_memory_gb: Annotated[float, typer.Option("--accelerator-memory-gb", min=1, help="Memory of one accelerator (GB).")] = 80.0,
    env_host_cpus: Annotated[float, typer.Option("--env-host-cpus", min=1, help="CPU cores of one environment host.")] = 32.0,
    env_host_memory_gb: Annotated[float, typer.Option("--env-host-memory-gb", min=1, help="Memory of one environment host (GB).")] = 128.0,
    step_seconds: Annotated[float, typer.Option("--step-seconds", min=0.001, help="Seconds per trainer step, for storage per day (stage 0's baseline tells).")] = 60.0,
    config: ConfigOpt = None,
    sets: SetOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Resource planning from the config: training memory per rank (weights + gradients + optimizer
    state under the ZeRO stage and precision) and the data-parallel size that fits; inference memory
    (weights + KV cache at model.context_length and the episodes per server); environment cores,
    memory and hosts (concurrency x harness cpu/memory); checkpoint and trajectory storage per day.
    Every line shows its formula and inputs.

    Examples:

    * `agentrl plan`

    * `agentrl plan --set model.path=/models/Qwen2.5-7B-Instruct --set training.precision=bf16 --accelerator-memory-gb 80`

    * `agentrl plan --step-seconds 45 --json`
    """
    from agentrl_cli.plan import PlanInputs, build_plan, model_shape, plan_dict

    cfg = load(config, sets).config
    inputs = PlanInputs(accelerator_memory_gb=accelerator_memory_gb, env_host_cpus=env_host_cpus,
                        env_host_memory_gb=env_host_memory_gb, step_seconds=step_seconds)
    shape = model_shape(cfg.model)
    lines = build_plan(cfg, shape, inputs)
    if json_out:
        print_json(plan_dict(shape, lines, inputs))
        return
    t = Table("area", "item", "value", "unit", "formula", title=f"resource plan: {shape.source}, {shape.params:,} parameters",
              title_justify="left")
    t.columns[4].overflow = "fold"
    for ln in lines:
        t.add_row(ln.area, ln.item, f"{ln.value:.4g}", ln.unit, ln.formula)
    out().print(t)
