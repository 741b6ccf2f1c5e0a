"""The SmolLM2 recipe's warm start: a short supervised fine-tune of an imported model on the
scripted solutions of a harness's practice tasks, played through the real harness (the same kind
of demonstrations the built-in model is warm-started on, `agentrl_cli/model/demos.py`), next-token
loss on the assistant's tokens only (`agentrl_cli/model/sft.py`), then imported as a new model.

SmolLM2-135M-Instruct never answers in reasoning-gym's `<answer>...</answer>` tags on its own (its
greedy success is 0 on every family measured, README "A real model learns here"); twenty steps on
the scripted `<answer>X</answer>` replies to practice tasks (templates/smollm2/warm_start_tasks.jsonl,
never a question of tasks.jsonl) teach it the format, and leave its arithmetic as weak as it was.

    .venv/bin/python templates/smollm2/warm_start.py --base smollm2 --name smollm2-answers \
        --cache-dir ~/.cache/agentrl [--steps 20] [--lr 2e-5] [--batch-size 8]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

HERE = Path(__file__).resolve().parent
STEPS, LR, BATCH = 20, 2e-5, 8


def demonstrations(harness: str, tasks_file: Path) -> list[dict]:
    """The scripted solution of every task in `tasks_file`, played through `harness`, as chat messages."""
    from types import SimpleNamespace

    from agentrl_cli.model.demos import episode_messages
    from harnesses.oracle import oracle_action
    from harnesses.registry import create
    from harnesses.task_sources import task_set

    h = create(harness)
    try:
        tasks = task_set(SimpleNamespace(name=harness, tasks=str(tasks_file), options={})).tasks
        return [{"harness": harness, "task_id": t.task_id, "messages": episode_messages(h, t, oracle_action), "tools": h.tools()}
                for t in tasks]
    finally:
        h.close()


def warm_start(base: Path, out: Path, demos: list[dict], steps: int, lr: float, batch_size: int, seed: int = 0) -> dict:
    """Fine-tune the model at `base` on `demos` (all parameters) and save it with its tokenizer at `out`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentrl_cli.model.sft import train_sft

    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    stats = train_sft(model, tokenizer, demos, steps=steps, batch_size=batch_size, lr=lr, seed=seed, max_len=512,
                      progress=lambda s, loss: print(f"warm start step {s}/{steps}: loss {loss:.3f}", file=sys.stderr, flush=True))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    for name in ("chat_template.jinja", "generation_config.json"):
        if (base / name).exists() and not (out / name).exists():
            (out / name).write_bytes((base / name).read_bytes())
    return stats


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", default="smollm2", help="model.path of the model to start from (an imported name or a directory)")
    p.add_argument("--name", default="smollm2-answers", help="name to import the warm-started model under")
    p.add_argument("--cache-dir", default="~/.cache/agentrl", help="model.cache_dir")
    p.add_argument("--harness", default="reasoning_gym")
    p.add_argument("--tasks", default=str(HERE / "warm_start_tasks.jsonl"), help="practice tasks (JSONL) to demonstrate")
    p.add_argument("--steps", type=int, default=STEPS)
    p.add_argument("--lr", type=float, default=LR)
    p.add_argument("--batch-size", type=int, default=BATCH)
    p.add_argument("--force", action="store_true", help="replace a model already imported under --name")
    args = p.parse_args()

    from agentrl_cli.model.importer import import_model
    from agentrl_cli.model.resolve import resolve_model_path

    start = time.perf_counter()
    base = resolve_model_path(args.base, args.cache_dir, build=False)
    demos = demonstrations(args.harness, Path(args.tasks))
    with tempfile.TemporaryDirectory(prefix="agentrl-warm-start-") as tmp:
        stats = warm_start(base, Path(tmp), demos, args.steps, args.lr, args.batch_size)
        card = import_model(tmp, args.cache_dir, args.name, force=args.force)
    record = {"name": args.name, "directory": card["directory"], "base": str(base), "harness": args.harness,
              "tasks": args.tasks, "demonstrations": len(demos), "sft": stats, "seconds": round(time.perf_counter() - start, 1)}
    (Path(card["directory"]) / "warm_start.json").write_text(json.dumps(record, indent=2) + "\n")  # where it came from
    print(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
