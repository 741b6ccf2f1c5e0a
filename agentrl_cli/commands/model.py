"""`agentrl model build-tiny|info`: the built-in model and what `model.path` resolves to."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from agentrl_cli.commands.common import ConfigOpt, JsonOpt, SetOpt, load, print_json
from agentrl_cli.model.recipe import SFT_STEPS
from agentrl_cli.observe.progress import WorkProgress

app = typer.Typer(help="Build the built-in tiny model and show what model.path resolves to.", no_args_is_help=True)


@app.command("build-tiny")
def build_tiny_command(
    force: Annotated[bool, typer.Option("--force", help="Rebuild even if a complete model is cached.")] = False,
    steps: Annotated[int, typer.Option("--steps", min=1, help="Warm-start (SFT) steps.")] = SFT_STEPS,
    config: ConfigOpt = None, sets: SetOpt = None, json_out: JsonOpt = False,
) -> None:
    """Build builtin:tiny-agent: scripted demonstrations from the training harnesses' task sets, a
    supervised warm start, saved as a Hugging Face model directory in model.cache_dir (about 10 minutes on 2 cores).

    Examples:

    * `agentrl model build-tiny`

    * `agentrl model build-tiny --force --steps 600`
    """
    from agentrl_cli.model.resolve import build_tiny, builtin_dir
    from agentrl_cli.model.tiny import COMPLETE

    loaded = load(config, sets)
    dest = builtin_dir(loaded.config.model.cache_dir)
    with WorkProgress(f"building the built-in model ({steps} warm-start steps)") as progress:
        path = build_tiny(dest, steps=steps, force=force, progress=progress.update)
    info = json.loads((path / COMPLETE).read_text())
    if json_out:
        print_json({"path": str(path), **info})
    else:
        typer.echo(f"{path}  ({info.get('kind')}, final SFT loss {info.get('sft', {}).get('final_loss', 'n/a')})")


@app.command("info")
def info_command(config: ConfigOpt = None, sets: SetOpt = None, json_out: JsonOpt = False) -> None:
    """Show what model.path resolves to and how the model was built (does not build).

    Examples:

    * `agentrl model info`

    * `agentrl model info --set model.path=/models/Qwen2.5-0.5B-Instruct --json`
    """
    from agentrl_cli.model.resolve import resolve_model_path
    from agentrl_cli.model.tiny import COMPLETE, is_complete

    loaded = load(config, sets)
    m = loaded.config.model
    path = resolve_model_path(m.path, m.cache_dir, build=False)
    meta_file = Path(path) / COMPLETE
    data = {"model.path": m.path, "directory": str(path), "complete": is_complete(path) or (Path(path) / "config.json").exists(),
            "build": json.loads(meta_file.read_text()) if meta_file.exists() else None}
    if json_out:
        print_json(data)
    else:
        for k, v in data.items():
            typer.echo(f"{k:10} {v}")
