"""Writes the SmolLM2 recipe's task sets (templates/smollm2/): `tasks.jsonl`, the training
harness's families (reasoning-gym's generated train and eval splits, as the reasoning_gym adapter
makes them, in one file so one harness holds several families), and `warm_start_tasks.jsonl`, the
practice tasks the warm start's scripted demonstrations are played on (the same families and
configs from another seed, so neither split of tasks.jsonl is ever demonstrated), each marked
`demonstration: worked`: the demonstration writes `2 * 5 = 10` before `<answer>10</answer>`, the
way SmolLM2 already computes in prose, so the tag holds a result it worked out rather than a guess.

    .venv/bin/python templates/smollm2/make_tasks.py

The families are the easiest configs of reasoning-gym datasets with short answers on which
SmolLM2-135M-Instruct's greedy success after the warm start is above 0 and below 0.5
(benchmarks/smollm2_baseline.py measures it); the held-out family is configured in platform.yaml.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from harnesses.adapters.reasoning_gym import build_tasks, parse_options  # noqa: E402

HERE = Path(__file__).resolve().parent
FAMILIES = {
    "products": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
    "chain_sum": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
}
SIZE = 64  # tasks per split before the adapter drops eval questions that are also in train
SEED = 1  # the adapter's default: train from seed 1, eval from seed 1 + EVAL_OFFSET
PRACTICE_SEED = 500_000  # far from both splits' seeds: reasoning-gym draws entry i from Random(seed + i)


def rows(seed: int, splits: tuple[str, ...]) -> list[dict]:
    out = []
    for dataset, config in FAMILIES.items():
        for t in build_tasks(parse_options({"dataset": dataset, "size": SIZE, "seed": seed, "config": config})):
            if t.split in splits:
                out.append({"task_id": t.task_id, "prompt": t.prompt, "answer": t.answer, "split": t.split,
                            "difficulty": t.difficulty, "meta": t.meta})
    return out


def write(path: Path, items: list[dict]) -> None:
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in items))
    print(f"wrote {len(items)} tasks to {path}")


def main() -> None:
    tasks = rows(SEED, ("train", "eval"))
    questions = {r["prompt"] for r in tasks}
    practice = [{**r, "task_id": r["task_id"].replace("/train/", "/practice/"), "split": "train",
                 "meta": {**r["meta"], "demonstration": "worked"}}
                for r in rows(PRACTICE_SEED, ("train",)) if r["prompt"] not in questions]
    write(HERE / "tasks.jsonl", tasks)
    write(HERE / "warm_start_tasks.jsonl", practice)


if __name__ == "__main__":
    main()
