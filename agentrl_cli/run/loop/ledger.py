"""The ledger of trained draws: per trainer step, which task draws (GRPO groups) it trained on.

A draw is the sampler's `group_id` (`g<seed>-<n>`: n is its draw index, the order the sampler drew
it in), its harness and task id. The run appends one entry per step (`run/loop/steps.py`); a checkpoint
keeps the ledger up to its step (`ledger.json` beside the engine), and a resumed run continues it,
so after any number of crashes and resumes the ledger says what the model was trained on.

`compare` checks one ledger against another (a resumed run against an uninterrupted one with the
same seed): draws missing, trained twice, or trained only by the one.

Belongs here: the ledger's entries, its file, and comparing ledgers. Not here: drawing tasks
(`runtime/rollout/sampler.py`), what else a checkpoint holds (`checkpoints.py`).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

FILE = "ledger.json"
SCHEMA_VERSION = 1


def draw_index(group_id: str) -> int | None:
    """The sampler's draw index of a group id (`g<seed>-<n>`), None for an id it did not make."""
    tail = group_id.rsplit("-", 1)[-1]
    return int(tail) if group_id.startswith("g") and tail.isdigit() else None


def ledger_entry(step: int, groups: list) -> dict:
    """The ledger's entry for trainer step `step`, which trained on `groups` (lists of buffer Episodes)."""
    draws = []
    for group in groups:
        record = group[0].record
        draws.append({"draw": draw_index(group[0].group_id), "group_id": group[0].group_id, "harness": record.harness,
                      "task_id": record.task_id, "episodes": len(group)})
    return {"step": step, "draws": draws}


def write_ledger(directory: Path, ledger: list[dict]) -> None:
    Path(directory, FILE).write_text(json.dumps({"schema_version": SCHEMA_VERSION, "steps": ledger}) + "\n", encoding="utf-8")


def read_ledger(directory: Path) -> list[dict] | None:
    """The ledger a checkpoint kept; None for a checkpoint written before ledgers were kept."""
    path = Path(directory, FILE)
    if not path.is_file():
        return None
    return list(json.loads(path.read_text(encoding="utf-8"))["steps"])


def trained_draws(ledger: list[dict]) -> Counter:
    """How many times each draw (group_id, harness, task_id) was trained on."""
    return Counter((d["group_id"], d["harness"], d["task_id"]) for entry in ledger for d in entry["draws"])


def compare(ledger: list[dict], reference: list[dict]) -> dict:
    """`ledger` against `reference`: draws trained more than once in `ledger` (repeated), trained by
    the reference and not by `ledger` (missing), and by `ledger` and not the reference (extra)."""
    mine, ref = trained_draws(ledger), trained_draws(reference)
    return {"trained": sum(mine.values()), "reference": sum(ref.values()),
            "repeated": sorted(d for d, n in mine.items() if n > 1),
            "missing": sorted(d for d in ref if d not in mine), "extra": sorted(d for d in mine if d not in ref)}
