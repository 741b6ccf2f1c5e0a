"""What an evaluation plays: the tasks of the chosen harnesses and split, and per task one greedy
episode (temperature 0) plus `samples` sampled ones at the evaluation's temperature.

- Tasks: every task of `split` of each harness (`harnesses[].tasks`, the harness's own, or the
  committed set: `harnesses.task_sources`), or with `limit` at most that many of each family, spread
  evenly over it as verify and stage 8 pick theirs. Numbered in plan order (`no`).
- Episodes: key `t<no>-<index>`, index 0 the greedy one, 1..samples the sampled ones. A sampled
  episode's seed is a hash of (seed, harness, task id, index): the same draw whatever order or
  attempt plays it, so a resumed evaluation samples what an uninterrupted one would have.
- Samples: by default max(k) when some k > 1, else none (pass@1 is then over the greedy episodes).
- Resume (`pending`): an episode without a row, or whose latest row is an infrastructure error, is
  played again; an episode the model failed is a result and is never replayed.

Not here: playing (`runner.py`), the files (`evaldir.py`), the totals (`passk.py`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from agentrl_cli.core.errors import ConfigError, UsageError
from agentrl_cli.acceptance.evaluation.passk import GREEDY, OK, SAMPLE

SEED_BITS = 31


@dataclass(frozen=True)
class Selection:
    """What the user asked to evaluate (before the tasks are read)."""

    harnesses: list[str]
    split: str
    ks: list[int]
    samples: int
    limit: int | None


def parse_ks(text: str) -> list[int]:
    """"1,4" -> [1, 4] (sorted, unique); UsageError for anything but positive integers."""
    try:
        ks = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        ks = []
    if not ks or ks[0] < 1:
        raise UsageError(f"-k {text!r} is not a list of positive integers", "write it like -k 1,4")
    return ks


def selection(cfg, harnesses: list[str] | None, split: str | None, ks: list[int], samples: int | None,
              limit: int | None) -> Selection:
    """The checked selection: known harnesses (default: every configured one, held-out included),
    enough samples for every k."""
    configured = [h.name for h in cfg.harnesses]
    names = list(dict.fromkeys(harnesses or configured))
    unknown = [n for n in names if n not in configured]
    if unknown:
        raise UsageError(f"--harness {', '.join(unknown)}: not a configured harness (configured: {', '.join(configured)})",
                         "name a harness of the config's `harnesses`, or add it there (--set 'harnesses=[{\"name\": ...}]')")
    top = max(ks)
    samples = (top if top > 1 else 0) if samples is None else samples
    if samples == 0 and top > 1:
        raise UsageError(f"pass@{top} needs {top} samples per task, but --samples is 0",
                         f"raise --samples to at least {top}, or ask only for -k 1 (over the greedy episodes)")
    if 0 < samples < top:
        raise UsageError(f"pass@{top} needs at least {top} samples per task, but --samples is {samples}",
                         f"raise --samples to {top}, or drop k above {samples}")
    return Selection(names, split or "eval", ks, samples, limit)


def select_tasks(cfg, sel: Selection) -> dict[str, tuple[str, list]]:
    """harness -> (its task set's version, the tasks to evaluate), in configured order."""
    from harnesses.task_sources import task_set

    out = {}
    for hc in [h for h in cfg.harnesses if h.name in sel.harnesses]:
        tasks = task_set(hc, cfg.data)
        chosen = tasks.select(sel.split)
        if not chosen:
            splits = sorted({t.split for t in tasks.tasks})
            raise UsageError(f"harness {hc.name} has no tasks of split {sel.split!r} (its splits: {', '.join(splits) or 'none'})",
                             f"choose one with --split, e.g. --split {splits[0] if splits else 'eval'}")
        out[hc.name] = (tasks.version, spread_by_family(chosen, sel.limit) if sel.limit else chosen)
    return out


def spread_by_family(tasks: list, per_family: int) -> list:
    """At most `per_family` tasks of each family, spread evenly over it, families in first-seen order."""
    by_family: dict[str, list] = {}
    for t in tasks:
        by_family.setdefault(family(t), []).append(t)
    return [t for group in by_family.values() for t in group[::max(1, len(group) // per_family)][:per_family]]


def family(task) -> str:
    return str(task.meta.get("family", "") or "")


def sample_seed(seed: int, harness: str, task_id: str, index: int) -> int:
    digest = hashlib.sha256(f"{seed}\0{harness}\0{task_id}\0{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % (1 << SEED_BITS)


def plan(cfg, sel: Selection, tasks: dict[str, tuple[str, list]], seed: int) -> dict:
    """The manifest's plan: harnesses (held-out flag, task-set version), tasks and episodes."""
    held_out = {h.name: h.held_out for h in cfg.harnesses}
    harnesses, task_rows, episodes = [], [], []
    for name, (version, chosen) in tasks.items():
        harnesses.append({"name": name, "held_out": held_out[name], "task_set_version": version, "tasks": len(chosen)})
        for t in chosen:
            no = len(task_rows)
            task_rows.append({"no": no, "harness": name, "task_id": t.task_id, "family": family(t)})
            for index in range(sel.samples + 1):
                episodes.append({"key": f"t{no:05d}-{index}", "task": no, "mode": GREEDY if index == 0 else SAMPLE,
                                 "index": index, "seed": sample_seed(seed, name, t.task_id, index)})
    return {"split": sel.split, "ks": sel.ks, "samples": sel.samples, "limit": sel.limit, "seed": seed,
            "harnesses": harnesses, "tasks": task_rows, "episodes": episodes}


def pending(manifest: dict, latest: dict[str, dict]) -> list[dict]:
    """The planned episodes to play now: never finished, or lost to an infrastructure error."""
    return [ep for ep in manifest["episodes"] if latest.get(ep["key"], {}).get("status") != OK]


def resolve_tasks(cfg, manifest: dict) -> dict[int, object]:
    """Task no -> its TaskSpec, read again from the configured task sets; a task set that changed
    since the evaluation started, or a harness no longer configured, is refused."""
    from harnesses.task_sources import task_set

    configured = {h.name: h for h in cfg.harnesses}
    by_harness = {}
    for h in manifest["harnesses"]:
        if h["name"] not in configured:
            raise ConfigError(f"the evaluation played harness {h['name']}, which the config no longer has",
                              "resume with the --config and --set the evaluation started with (its command is in eval.json)")
        ts = task_set(configured[h["name"]], cfg.data)
        if ts.version != h["task_set_version"]:
            raise ConfigError(f"the task set of {h['name']} changed since the evaluation started "
                              f"(version {h['task_set_version']}, now {ts.version})",
                              "resume needs the same tasks: restore them, or start a new evaluation")
        by_harness[h["name"]] = {t.task_id: t for t in ts.tasks}
    out = {}
    for t in manifest["tasks"]:
        spec = by_harness[t["harness"]].get(t["task_id"])
        if spec is None:
            raise ConfigError(f"task {t['task_id']} of {t['harness']} is no longer in its task set",
                              "restore the task set the evaluation started with, or start a new evaluation")
        out[t["no"]] = spec
    return out
