"""One invocation of `agentrl eval`: a new evaluation (the plan, its manifest, the episodes, the
totals) or the resume of one (its manifest and results, the episodes missing or lost to an
infrastructure error, then the totals over all of them).

A resume plays the evaluation's own plan on its own model (the recorded model directory, or the
run's recorded checkpoint exported again) with the sampling temperature it started with; the
config given now supplies everything else (ports, servers, sandboxes), and where it differs from
the recorded one the differences are reported (`config_changes`). Sampled episodes keep their
seeds, so with `rollout.eval_concurrency: 1` (one episode at a time: the same batches) and
`inference.prefix_cache_tokens: 0` (no reuse of what an earlier episode computed) a resumed
evaluation plays exactly what an uninterrupted one would have.

Not here: the command line (`cli/commands/eval.py`), playing (`runner.py`), the totals (`passk.py`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Callable

from agentrl_cli.core.errors import AgentrlError, UsageError
from agentrl_cli.acceptance.evaluation.evaldir import SCHEMA_VERSION, EvalDir, create_eval_dir, find_eval, latest
from agentrl_cli.acceptance.evaluation.passk import summarize
from agentrl_cli.acceptance.evaluation.plan import pending, plan, resolve_tasks, select_tasks, selection
from agentrl_cli.acceptance.evaluation.source import ModelSource, find_source, model_dir, recorded_source
from agentrl_cli.core.outcomes import Phase
from agentrl_cli.core.rundir import now_iso

Progress = Callable[[str, int, int], None]  # (phase, done, total), as observe.progress.WorkProgress.update
MAX_CHANGES = 20  # config differences listed on a resume


@dataclass
class EvalOutcome:
    evaldir: EvalDir
    manifest: dict
    summary: dict
    planned_now: int  # episodes this invocation set out to play
    played_now: int  # of them, recorded in results.jsonl
    resumed: bool = False
    config_changes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        m = self.manifest
        return {"schema_version": SCHEMA_VERSION, "eval_id": self.evaldir.eval_id, "dir": str(self.evaldir.path),
                "model": m["model"], "split": m["split"], "ks": m["ks"], "samples": m["samples"],
                "temperature": m["temperature"], "seed": m["seed"], "limit": m["limit"],
                "pass_at_k_over": "samples" if m["samples"] else "greedy", "resumed": self.resumed,
                "attempts": 1 + len(m["resumes"]), "planned_now": self.planned_now, "played_now": self.played_now,
                "config_changes": self.config_changes, "episodes_planned": len(m["episodes"]), **self.summary}


def start(loaded, spec: str | None, *, harnesses: list[str] | None, split: str | None, ks: list[int],
          samples: int | None, limit: int | None, command: list[str], progress: Progress) -> EvalOutcome:
    """A new evaluation of the model or run `spec` (None: model.path)."""
    cfg = loaded.config
    sel = selection(cfg, harnesses, split, ks, samples, limit)
    tasks = select_tasks(cfg, sel)
    source = find_source(spec, cfg)
    evaldir = create_eval_dir(cfg.observe.runs_dir)
    manifest = {"schema_version": SCHEMA_VERSION, "eval_id": evaldir.eval_id, "created_at": now_iso(), "command": command,
                "model": source.to_dict(), "temperature": cfg.inference.temperature,
                **plan(cfg, sel, tasks, cfg.rollout.seed), "config_source": loaded.source,
                "config_overrides": loaded.masked_overrides(), "config_hash": loaded.hash, "config": loaded.resolved(),
                "resumes": []}
    with evaldir.lock():
        evaldir.write_manifest(manifest)
        return _play(cfg, evaldir, manifest, source, manifest["episodes"], 0, progress)


def resume(loaded, ref: str, spec: str | None, *, command: list[str], progress: Progress) -> EvalOutcome:
    """Play what evaluation `ref` (id, directory or `latest`) is missing or lost, and total it all."""
    cfg = loaded.config
    evaldir = find_eval(cfg.observe.runs_dir, ref)
    with evaldir.lock():
        manifest = evaldir.manifest()
        if spec is not None and spec != manifest["model"]["spec"]:
            raise UsageError(f"evaluation {evaldir.eval_id} is of {manifest['model']['spec']!r}, not {spec!r}",
                             f"leave MODEL_OR_RUN out with --resume, or start a new evaluation of {spec}")
        source = recorded_source(manifest["model"], cfg)
        evaldir.repair()
        todo = pending(manifest, latest(evaldir.results()))
        changes = config_changes(manifest["config"], loaded.resolved())
        attempt = len(manifest["resumes"]) + 1
        manifest["resumes"].append({"at": now_iso(), "attempt": attempt, "episodes": len(todo), "command": command,
                                    "config_hash": loaded.hash, "config_changes": changes})
        evaldir.write_manifest(manifest)
        outcome = _play(cfg, evaldir, manifest, source, todo, attempt, progress)
    outcome.resumed, outcome.config_changes = True, changes
    return outcome


def _play(cfg, evaldir: EvalDir, manifest: dict, source: ModelSource, episodes: list[dict], attempt: int,
          progress: Progress) -> EvalOutcome:
    played = 0
    if episodes:
        tasks = resolve_tasks(cfg, manifest)
        try:
            with model_dir(source, cfg, evaldir.path, lambda message: progress(message, 0, 0)) as path:
                played = asyncio.run(_run(cfg, evaldir, manifest, path, episodes, tasks, attempt, progress))
        except AgentrlError as exc:
            exc.hint = "; ".join(p for p in (exc.hint, f"then `agentrl eval --resume {evaldir.eval_id}` plays what is "
                                             "missing") if p)
            raise
    summary = summarize(manifest, latest(evaldir.results()))
    outcome = EvalOutcome(evaldir, manifest, summary, len(episodes), played)
    evaldir.write_summary(outcome.to_dict())
    return outcome


async def _run(cfg, evaldir: EvalDir, manifest: dict, model_path, episodes: list[dict], tasks: dict, attempt: int,
               progress: Progress) -> int:
    from agentrl_cli.acceptance.evaluation.runner import play_episodes
    from agentrl_cli.run.training_run import training

    names = [h["name"] for h in manifest["harnesses"]]
    async with training(run_config(cfg, names), evaldir.path, model_path, run_id=evaldir.eval_id, phase=Phase.EVAL,
                        progress=lambda message: progress(message, 0, 0), trainer=False) as run:
        progress("episodes", 0, len(episodes))
        return await play_episodes(run, evaldir, manifest, episodes, tasks, attempt=attempt,
                                   progress=lambda done, total: progress("episodes", done, total))


def run_config(cfg, names: list[str]):
    """The config the rollout side starts with: only the evaluated harnesses (no sandbox pool for
    the others), none held out and each weighted (the run's task sampler wants one to draw from;
    it draws nothing here)."""
    chosen = [h.model_copy(update={"held_out": False, "weight": h.weight or 1.0}) for h in cfg.harnesses if h.name in names]
    return cfg.model_copy(update={"harnesses": chosen})


def config_changes(recorded: dict, now: dict) -> list[str]:
    """`key: recorded -> now` for each config key whose value differs (secrets are masked in both)."""
    a, b = dict(_flat(recorded)), dict(_flat(now))
    changed = [f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    return changed[:MAX_CHANGES] + ([f"... and {len(changed) - MAX_CHANGES} more"] if len(changed) > MAX_CHANGES else [])


def _flat(data, prefix: str = ""):
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _flat(v, f"{prefix}{k}.")
    else:
        yield prefix.rstrip("."), data
