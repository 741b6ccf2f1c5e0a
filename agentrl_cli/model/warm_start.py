"""`agentrl model sft`: a short supervised warm start of a model on the scripted solutions of a
harness's tasks, imported as a new model.

The demonstrations are the tasks of the training split (`--split`; evaluation tasks stay unseen),
played through the real harness by its scripted solutions
(`scripted_action`, `harnesses/oracle.py`), the same kind the built-in model is warm-started on
(`model/demos.py`); the loss is next-token on the assistant's tokens only (`model/sft.py`), all
parameters, AdamW with warm-up and cosine decay. The result is imported into `model.cache_dir`
under its own name with `warm_start.json` beside its card (base, harness, tasks, steps, losses).

A model that never writes the format a harness scores (SmolLM2-135M-Instruct and reasoning-gym's
`<answer>...</answer>` tags) learns it in a few dozen steps on practice tasks, so reinforcement
learning starts from a success rate above 0 (docs/inference.md, "A real model learns here").

A multi-agent harness (`harnesses.multi_agent`: one that declares roles) is played by its roles'
`scripted_move`, and every role its `harnesses[].roles` seats `policy` (all of them by default:
self-play) gets one demonstration per task: that role's own conversation exactly as the rollout
renders it for a model-played role (`multi_agent.scripted_conversations`: its `role_prompt`, the
harness's `tools()`, its `observe(role)` views, its moves), so the warm-started model sees at serve
time what it saw in training. Roles seated `scripted` or at an opponent's server are played, never trained.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Callable

from agentrl_cli.core.errors import ConfigError


def demonstrations(cfg, harness_config, limit: int | None = None, split: str = "train") -> list[dict]:
    """The scripted solution of every task of `split` ("all": every split) of `harness_config` (a
    `harnesses[]` entry of `cfg`: its `tasks` file or the class's own task set), played through the
    harness as a run builds it, as chat messages."""
    from harnesses.multi_agent import is_multi_agent
    from harnesses.oracle import ORACLES, oracle_action
    from harnesses.registry import create, resolve

    from agentrl_cli.model.demos import episode_messages

    name = harness_config.name
    cls = resolve(name)  # an unknown name is refused here, listing the registered ones
    if is_multi_agent(cls):
        return role_demonstrations(cfg, harness_config, limit, split)
    if name not in ORACLES:
        raise ConfigError(f"harness {name!r} has no scripted solutions (no scripted_action hook), so there is nothing "
                          "to demonstrate", "warm-start on a harness that has one (`agentrl harness list` shows them), "
                          "or give the harness class a scripted_action(task, turn) classmethod")
    tasks = split_tasks(cfg, harness_config, split, limit)
    harness = create(name, cfg)
    try:
        return [{"harness": name, "task_id": t.task_id, "messages": episode_messages(harness, t, oracle_action),
                 "tools": harness.tools()} for t in tasks]
    finally:
        harness.close()


def role_demonstrations(cfg, harness_config, limit: int | None = None, split: str = "train") -> list[dict]:
    """For a multi-agent harness: the conversation of every policy-seated role in the scripted play
    of every task (`multi_agent.scripted_conversations`), one demonstration per (task, role), with
    its `role` and the harness's tools (the rollout offers every model-played role those)."""
    from harnesses.multi_agent import policy_roles, scripted_conversations, seats
    from harnesses.registry import create, resolve

    name = harness_config.name
    cls = resolve(name)
    if not hasattr(cls, "scripted_move"):
        raise ConfigError(f"harness {name!r} has roles but no scripted_move, so there is nothing to demonstrate",
                          "give the harness class a scripted_move(role) method (harnesses/multi_agent.py)")
    trained = policy_roles(seats(cls, getattr(harness_config, "roles", None), name))
    tasks = split_tasks(cfg, harness_config, split, limit)
    harness = create(name, cfg)
    try:
        tools = harness.tools() if hasattr(harness, "tools") else []  # the contract's default: none
        out = []
        for t in tasks:
            conversations = scripted_conversations(harness, t)
            out += [{"harness": name, "task_id": t.task_id, "role": role, "messages": conversations[role],
                     "tools": tools} for role in trained if role in conversations]
        return out
    finally:
        harness.close()


def split_tasks(cfg, harness_config, split: str, limit: int | None) -> list:
    """The tasks of `split` ("all": every split) of a configured harness; ConfigError when there are none."""
    from harnesses.task_sources import task_set

    every = task_set(harness_config, cfg.data).tasks
    tasks = [t for t in every if split == "all" or t.split == split][:limit]
    if not tasks:
        held = f" of split {split!r} (it has {', '.join(sorted({t.split for t in every}))})" if every else ""
        raise ConfigError(f"harness {harness_config.name!r} has no tasks{held} to demonstrate",
                          "point --tasks at a JSONL file of tasks with split: train, or pass --split all")
    return tasks


def warm_start(base: Path, out: Path, demos: list[dict], *, steps: int, lr: float, batch_size: int, max_len: int,
               seed: int = 0, progress: Callable[[int, float], None] = lambda step, loss: None) -> dict:
    """Fine-tune the model at `base` on `demos` and save it with its tokenizer and chat files at `out`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentrl_cli.model.sft import train_sft

    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    try:
        stats = train_sft(model, tokenizer, demos, steps=steps, batch_size=batch_size, lr=lr, seed=seed, max_len=max_len,
                          progress=progress)
    except ValueError as exc:
        raise ConfigError(str(exc), "lower --batch-size, or give more tasks (--tasks), or raise model.context_length") from exc
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    for name in ("chat_template.jinja", "generation_config.json"):
        if (base / name).exists() and not (out / name).exists():
            (out / name).write_bytes((base / name).read_bytes())
    return stats


def sft_model(cfg, harness_config, name: str, *, base: str | None = None, steps: int, lr: float, batch_size: int,
              seed: int = 0, force: bool = False, split: str = "train", progress: Callable[[str], None] = lambda message: None) -> dict:
    """Warm-start `base` (default model.path) on the scripted solutions of `harness_config`'s tasks of
    `split` (the training split by default: evaluation tasks stay unseen) and import the result as
    `name`; returns the record also written to `warm_start.json` in the new model's directory."""
    from agentrl_cli.model.importer import import_model
    from agentrl_cli.model.resolve import resolve_model_path

    start = time.perf_counter()
    base = base or cfg.model.path
    base_dir = Path(resolve_model_path(base, cfg.model.cache_dir, build=False))
    progress(f"playing the scripted solutions of {harness_config.name}'s tasks")
    demos = demonstrations(cfg, harness_config, split=split)
    with tempfile.TemporaryDirectory(prefix="agentrl-sft-") as tmp:
        stats = warm_start(base_dir, Path(tmp), demos, steps=steps, lr=lr, batch_size=batch_size,
                           max_len=cfg.model.context_length, seed=seed,
                           progress=lambda s, loss: progress(f"step {s}/{steps}: loss {loss:.3f}"))
        progress(f"importing as {name}")
        card = import_model(tmp, cfg.model.cache_dir, name, force=force, dtype=cfg.model.dtype)
    record = {"name": card["name"], "directory": card["directory"], "base": base, "base_directory": str(base_dir),
              "harness": harness_config.name, "tasks": getattr(harness_config, "tasks", None), "split": split,
              "demonstrations": len(demos),
              **({"roles": dict(Counter(d["role"] for d in demos))} if any("role" in d for d in demos) else {}),
              "sft": stats, "seconds": round(time.perf_counter() - start, 1)}
    (Path(card["directory"]) / "warm_start.json").write_text(json.dumps(record, indent=2) + "\n")
    return record
