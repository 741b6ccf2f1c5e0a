"""`agentrl reward train`: a reward model from the stored trajectories of runs (`reward_model.py`
serves it).

1. Data: each run's trajectories from its trajectory store (the store its meta.json records, else
   `data.*` of this config), filtered by run id. Labels: 1 for outcome `success`, 0 for any other
   verified outcome; left out and counted: `infra_error`/masked rows (no verdict), unscored rows
   and the per-role rows of multi-agent episodes (the rendering is single-agent).
2. Text: `reward_model.render`, with the task prompt taken from the harness's task set (what a
   ScoreRequest carries at serving time); a task not found there falls back to the stored initial
   observation, counted (`prompts_from_observation`).
3. Split BY TASK: a seeded shuffle of the tasks, `held_out_fraction` of them held out, the first
   shuffle whose train and held-out parts both hold both labels; no task is on both sides.
4. Scorer: the base stays frozen; its last hidden state at the final token is standardised and a
   linear head is fitted (class-balanced logistic loss, L2, Adam, full batch, `steps` steps).
5. Calibration: Platt scaling (with Platt's target smoothing) fitted on train tasks only, on
   out-of-fold logits (3 folds by task) so it is not fitted to the head's own training fit.
6. Held-out report: AUC with a 95% percentile-bootstrap interval over held-out tasks, ECE before and
   after calibration with the reliability table, Brier score, counts.
7. Saved atomically to `<model.cache_dir>/reward-models/<name>` (see `reward_model.py`).

Refusals (UsageError / NotFoundError, exit 2, with the fix): a run with no stored trajectories,
a single label class, too few tasks to hold out.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from agentrl_cli.core.errors import NotFoundError, UsageError
from agentrl_cli.runtime.reward import rm_metrics
from agentrl_cli.runtime.reward.reward_model import (DEFAULT_MAX_TOKENS, FORMAT_VERSION, HEAD, RECORD, RENDER_VERSION, SUBDIR,
                                             Head, features, load_base, render, version_of, weights_digest)

MIN_TASKS = 4
FOLDS = 3
SPLIT_TRIES = 200
Progress = Callable[[str], None]


@dataclass
class Example:
    text: str
    label: int
    task: str  # harness/task_id: the unit of the split
    run_id: str


@dataclass
class Settings:
    steps: int = 300
    held_out_fraction: float = 0.3
    seed: int = 0
    max_tokens: int = DEFAULT_MAX_TOKENS
    l2: float = 1e-2
    lr: float = 0.05


# ---- data ---------------------------------------------------------------------------------------

def _run_dir(spec: str, cfg):
    from agentrl_cli.core.rundir import RunDir, get_run

    given = Path(spec).expanduser()
    if (given / "meta.json").is_file():
        return RunDir(given.absolute())
    return get_run(Path(cfg.observe.runs_dir).expanduser(), spec)  # NotFoundError naming the runs


def _store_of(meta: dict, cfg):
    """The store the run wrote to (its recorded data config, when it still resolves), else this config's."""
    from agentrl_cli.config.models import DataConfig
    from agentrl_cli.runtime.data.stores import open_store

    recorded = (meta.get("config") or {}).get("data")
    try:
        data = DataConfig.model_validate(recorded) if recorded else cfg.data
    except ValueError:
        data = cfg.data
    if data.store == "local" and not Path(data.root).expanduser().is_dir():
        data = cfg.data
    return open_store(data), data


def run_records(spec: str, cfg) -> tuple[str, list, dict, str]:
    """(run id, its stored trajectories, its meta.json, the store's description)."""
    import pyarrow.compute as pc

    from agentrl_cli.runtime.data.writer import read_records

    run = _run_dir(spec, cfg)
    meta = run.meta()
    store, data = _store_of(meta, cfg)
    where = f"{data.store} store {data.root if data.store == 'local' else store.url}"
    records = read_records(store, pc.field("run_id") == run.run_id)
    if not records:
        raise NotFoundError(f"run {run.run_id} has no stored trajectories in the {where}",
                            "train on a run that stored trajectories (`agentrl stage run 8 --phase smoke` stores them), "
                            "or point data.root at the store the run wrote to")
    return run.run_id, records, meta, where


def task_prompts(harness_names: set[str], cfg) -> dict[tuple[str, str], str]:
    """(harness, task id) -> the task's prompt, from each harness's task set (a harness whose task
    set cannot be built contributes nothing)."""
    from harnesses.task_sources import builtin_or_own, task_set

    prompts: dict[tuple[str, str], str] = {}
    entries = {h.name: h for h in cfg.harnesses}
    for name in sorted(harness_names):
        try:
            tasks = task_set(entries[name], cfg.data) if name in entries else builtin_or_own(name)
        except Exception:  # noqa: BLE001 - no task set: the stored initial observation stands in (counted)
            continue
        prompts.update({(name, t.task_id): t.prompt for t in tasks.tasks})
    return prompts


def examples_of(records: list, prompts: dict[tuple[str, str], str], counts: Counter) -> list[Example]:
    out = []
    for r in records:
        if r.role is not None:
            counts["left_out_multi_agent_role_rows"] += 1
            continue
        if r.reward_status == "infra_error" or "infra_error" in r.flags or "quarantined_task" in r.flags:
            counts["left_out_masked"] += 1
            continue
        if r.reward_status == "unscored":
            counts["left_out_unscored"] += 1
            continue
        prompt = prompts.get((r.harness, r.task_id))
        if prompt is None:
            counts["prompts_from_observation"] += 1
            prompt = r.initial_observation
        text = render(r.harness, prompt, [(s.action, s.observation, s.observation_status) for s in r.steps], r.final_answer)
        out.append(Example(text, int(r.outcome == "success"), f"{r.harness}/{r.task_id}", r.run_id))
    return out


# ---- split --------------------------------------------------------------------------------------

def split_by_task(examples: list[Example], fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """(train tasks, held-out tasks): disjoint, each side holding both labels."""
    labels_of: dict[str, set[int]] = {}
    for e in examples:
        labels_of.setdefault(e.task, set()).add(e.label)
    tasks = sorted(labels_of)
    n_held = max(2, round(fraction * len(tasks)))
    if len(tasks) < MIN_TASKS or len(tasks) - n_held < 2:
        raise UsageError(f"too few tasks to hold out: {len(tasks)} task(s) with labelled trajectories; a split needs at "
                         f"least {MIN_TASKS} (held out: {n_held}, at least 2 left to train on)",
                         "train on more runs (--from RUN1,RUN2) or a longer run (`agentrl stage run 8 --phase short`)")
    rng = np.random.default_rng(seed)
    for _ in range(SPLIT_TRIES):
        order = [tasks[i] for i in rng.permutation(len(tasks))]
        held, train = sorted(order[:n_held]), sorted(order[n_held:])
        if all(set().union(*(labels_of[t] for t in side)) == {0, 1} for side in (held, train)):
            return train, held
    raise UsageError(f"too few tasks to hold out: no split of the {len(tasks)} tasks puts successes and failures on both "
                     "the train and the held-out side (the successes are in too few tasks)",
                     "train on more runs (--from RUN1,RUN2), or change --held-out")


# ---- fitting ------------------------------------------------------------------------------------

def fit_head(x, y, s: Settings) -> Head:
    """A linear head on standardised features: class-balanced logistic loss plus L2 (zero start:
    the fit is deterministic)."""
    import torch

    mean, std = x.mean(0), x.std(0).clamp_min(1e-6)
    z = (x - mean) / std
    target = torch.as_tensor(y, dtype=torch.float32)
    n_pos = float(target.sum())
    pos_weight = torch.tensor((len(target) - n_pos) / max(n_pos, 1.0))
    w = torch.zeros(z.shape[1], requires_grad=True)
    b = torch.zeros((), requires_grad=True)
    opt = torch.optim.Adam([w, b], lr=s.lr)
    loss_fn = torch.nn.BCEWithLogitsLoss(pos_weight=pos_weight)
    for _ in range(s.steps):
        opt.zero_grad()
        loss = loss_fn(z @ w + b, target) + s.l2 * (w ** 2).sum()
        loss.backward()
        opt.step()
    return Head(w.detach(), b.detach(), mean, std)


def fit_platt(logits, labels) -> dict:
    """a, b of p = sigmoid(a * logit + b), fitted by maximum likelihood on Platt's smoothed targets."""
    import torch

    y = np.asarray(labels, dtype=float)
    n_pos, n_neg = y.sum(), len(y) - y.sum()
    target = torch.as_tensor(np.where(y == 1, (n_pos + 1) / (n_pos + 2), 1 / (n_neg + 2)), dtype=torch.float64)
    s = torch.as_tensor(np.asarray(logits, dtype=float), dtype=torch.float64)
    a = torch.ones((), dtype=torch.float64, requires_grad=True)
    b = torch.zeros((), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([a, b], lr=0.5, max_iter=200, line_search_fn="strong_wolfe")
    loss_fn = torch.nn.BCEWithLogitsLoss()

    def closure():
        opt.zero_grad()
        loss = loss_fn(a * s + b, target)
        loss.backward()
        return loss

    opt.step(closure)
    return {"method": "platt", "a": float(a.detach()), "b": float(b.detach())}


def out_of_fold_logits(x, y, tasks: list[str], s: Settings) -> tuple[np.ndarray, str]:
    """Each train trajectory's logit from a head fitted on the other folds (folds by task); the
    in-sample logits when a fold's complement lacks a label."""
    names = sorted(set(tasks))
    rng = np.random.default_rng(s.seed + 1)
    fold_of = {t: i % FOLDS for i, t in enumerate(names[j] for j in rng.permutation(len(names)))}
    folds = np.array([fold_of[t] for t in tasks])
    y = np.asarray(y)
    out = np.zeros(len(y))
    if len(names) >= FOLDS and all(set(y[folds != k].tolist()) == {0, 1} for k in range(FOLDS)):
        for k in range(FOLDS):
            head = fit_head(x[folds != k], y[folds != k], s)
            out[folds == k] = head.logits(x[folds == k]).numpy()
        return out, f"out-of-fold logits of the train tasks ({FOLDS} folds by task)"
    return fit_head(x, y, s).logits(x).numpy(), "in-sample logits of the train tasks (too few tasks for folds)"


def _sigmoid(z) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.asarray(z, dtype=float)))


# ---- the whole job ------------------------------------------------------------------------------

def train(cfg, runs: list[str], *, base: str = "", name: str = "", settings: Settings | None = None,
          progress: Progress = lambda message: None) -> dict:
    """Train, measure on held-out tasks and save; returns the saved record (with `path`)."""
    import torch

    from agentrl_cli.model.resolve import resolve_model_path

    s = settings or Settings()
    if not runs:
        raise UsageError("--from names no run", "give one or more run ids or directories: --from RUN[,RUN...]")
    counts: Counter = Counter()
    examples: list[Example] = []
    sources = []
    first_meta: dict = {}
    for spec in runs:
        run_id, records, meta, where = run_records(spec, cfg)
        first_meta = first_meta or meta
        counts["trajectories"] += len(records)
        prompts = task_prompts({r.harness for r in records}, cfg)
        got = examples_of(records, prompts, counts)
        examples += got
        sources.append({"run_id": run_id, "store": where, "trajectories": len(records), "labelled": len(got)})
        progress(f"run {run_id}: {len(records)} stored trajectories, {len(got)} labelled ({where})")
    labels = Counter(e.label for e in examples)
    if len(labels) < 2:
        only = "success" if 1 in labels else "not success"
        raise UsageError(f"only one label class: all {len(examples)} labelled trajectories of {', '.join(runs)} are {only}",
                         "train on runs whose outcomes are mixed (e.g. the built-in model: `agentrl stage run 8 --phase "
                         "smoke --set model.path=builtin:tiny-agent`), or add runs with --from RUN1,RUN2")
    train_tasks, held_tasks = split_by_task(examples, s.held_out_fraction, s.seed)

    base_spec = base or ((first_meta.get("config") or {}).get("model") or {}).get("path") or cfg.model.path
    base_path = Path(resolve_model_path(base_spec, cfg.model.cache_dir)).absolute()
    progress(f"base {base_spec} ({base_path}), frozen; features of {len(examples)} trajectories")
    model, tokenizer = load_base(base_path)
    max_tokens = min(s.max_tokens, int(getattr(model.config, "max_position_embeddings", s.max_tokens) or s.max_tokens))
    torch.manual_seed(s.seed)
    x = features(model, tokenizer, [e.text for e in examples], max_tokens,
                 progress=lambda done, total: progress(f"features {done}/{total}") if done % 64 < 8 or done == total else None)
    y = np.array([e.label for e in examples])
    held_set = set(held_tasks)
    is_held = np.array([e.task in held_set for e in examples])
    tr, ho = np.flatnonzero(~is_held), np.flatnonzero(is_held)
    tr_t, ho_t = torch.as_tensor(tr), torch.as_tensor(ho)

    progress(f"head: {s.steps} steps on {len(tr)} train trajectories ({len(train_tasks)} tasks)")
    oof, platt_fit = out_of_fold_logits(x[tr_t], y[tr], [examples[i].task for i in tr], s)
    calibration = {**fit_platt(oof, y[tr]), "fitted_on": platt_fit}
    head = fit_head(x[tr_t], y[tr], s)
    held_logits = head.logits(x[ho_t]).numpy()
    train_logits = head.logits(x[tr_t]).numpy()
    calibrated = _sigmoid(calibration["a"] * held_logits + calibration["b"])
    raw = _sigmoid(held_logits)
    held_groups = [examples[i].task for i in ho]
    ci = rm_metrics.auc_ci(held_logits, y[ho], held_groups, seed=s.seed)
    metrics = {
        "held_out": {
            "auc": rm_metrics.auc(held_logits, y[ho]),
            "auc_ci95": {**ci, "level": 0.95, "method": "percentile bootstrap over held-out tasks"},
            "ece": rm_metrics.ece(calibrated, y[ho]), "ece_uncalibrated": rm_metrics.ece(raw, y[ho]),
            "brier": rm_metrics.brier(calibrated, y[ho]),
            "reliability": rm_metrics.reliability(calibrated, y[ho]),
            "trajectories": len(ho), "successes": int(y[ho].sum()), "tasks": len(held_tasks)},
        "train": {"auc": rm_metrics.auc(train_logits, y[tr]), "trajectories": len(tr), "successes": int(y[tr].sum()),
                  "tasks": len(train_tasks)},
    }
    name = name or f"rm-{sources[0]['run_id']}"
    record = {
        "format_version": FORMAT_VERSION, "render_version": RENDER_VERSION, "name": name,
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "base": {"spec": base_spec, "path": str(base_path), "weights_sha256": weights_digest(base_path), "frozen": True,
                 "hidden_size": int(x.shape[1])},
        "head": {"file": HEAD, "kind": "linear on the standardised last hidden state at the final token",
                 "steps": s.steps, "lr": s.lr, "l2": s.l2, "loss": "class-balanced logistic"},
        "max_tokens": max_tokens, "calibration": calibration,
        "source_runs": sources, "counts": {**dict(counts), "labelled": len(examples), "successes": labels[1],
                                           "failures": labels[0], "tasks": len(train_tasks) + len(held_tasks)},
        "split": {"by": "task", "held_out_fraction": s.held_out_fraction, "seed": s.seed, "train_tasks": train_tasks,
                  "held_out_tasks": held_tasks},
        "metrics": metrics,
    }
    dest = Path(cfg.model.cache_dir).expanduser() / SUBDIR / name
    record["version"] = _save(dest, head, record)
    record["path"] = str(dest)
    return record


def _save(dest: Path, head: Head, record: dict) -> str:
    """Write the directory atomically (a temp sibling renamed into place); returns the version."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        head.save(tmp / HEAD)
        version = version_of(tmp, record)
        (tmp / RECORD).write_text(json.dumps({**record, "version": version}, indent=2) + "\n", encoding="utf-8")
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return version
