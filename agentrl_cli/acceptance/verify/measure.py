"""What verify measures when the run did not record it.

- The verification run (`runs/<id>/verify/`): with no training to judge, verify trains itself with
  the stage 8 short recipe for part of `verify.minutes`, evaluates every harness (held-out included)
  greedily before and after, plays every canary with the trained policy, plays a few tasks twice
  with the same seed, and resumes from its checkpoint in a copy of the directory to take one more
  step. The extras go to `verify/extra.json`, with the trainer restarts (`training.max_restarts`)
  the verification run needed. Both runs restart after a trainer crash (`run.supervised`).
- The baseline loop again (`verify/probe.json`), or the baseline itself (`baseline.json`) when no
  run on this machine has one.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

from agentrl_cli.core.outcomes import Phase
from agentrl_cli.core.report import atomic_write_text

REPEAT_TASKS = 3
MIN_STEPS = 3  # the fewest steps a verification run trains, whatever the budget (a checkpoint is written there)
TRAIN_SHARE = 0.6  # of verify.minutes; evaluation, canaries, repeats and the resume take the rest


def eval_tasks(cfg, per_family: int) -> dict:
    """harness -> up to `per_family` eval tasks of each family, from the harness's configured task set."""
    from harnesses.task_sources import task_set

    out = {}
    for h in cfg.harnesses:
        by_family: dict[str, list] = {}
        for t in task_set(h, cfg.data).select("eval"):
            by_family.setdefault(t.meta.get("family", ""), []).append(t)
        out[h.name] = [t for tasks in by_family.values() for t in tasks[::max(1, len(tasks) // per_family)][:per_family]]
    return out


def run_config(cfg):
    from agentrl_cli.config.load import with_overrides

    recipe = cfg.stages.short_recipe
    cfg = with_overrides(cfg, recipe, "stages.short_recipe") if recipe else cfg
    return with_overrides(cfg, {"training.checkpoint_interval_steps": min(cfg.training.checkpoint_interval_steps, 5),
                                "training.resume_from_latest": False}, "the verification run")


def verification_run(cfg, run, progress) -> str:
    from agentrl_cli.model.resolve import resolve_model_path
    from agentrl_cli.run.kept_servers import KeptServers

    recipe = "the stage 8 short recipe" if cfg.stages.short_recipe else "the config as it is (stages.short_recipe is null)"
    cfg = run_config(cfg)
    path = resolve_model_path(cfg.model.path, cfg.model.cache_dir)
    workdir = run.path / "verify"
    if workdir.exists():
        shutil.rmtree(workdir)
    minutes = cfg.verify.minutes
    kept = KeptServers()  # the resume probe's run takes the verification run's inference servers: no second model load
    try:
        extra = asyncio.run(_train_and_probe(cfg, path, workdir, run.run_id, minutes * 60 * TRAIN_SHARE, progress, kept))
        extra["resume"] = _resume(cfg, path, workdir, run.run_id, progress, kept)
    finally:
        kept.close()
    atomic_write_text(workdir / "extra.json", json.dumps(extra, indent=2, default=str) + "\n")
    return (f"no run had training to judge: verify trained {extra['steps']} steps (at least {MIN_STEPS}, then up to "
            f"{minutes * TRAIN_SHARE:g} of verify.minutes = {minutes:g}) with {recipe} in {workdir} and judged that")


async def _train_and_probe(cfg, path: Path, workdir: Path, run_id: str, deadline_s: float, progress, kept) -> dict:
    import time

    from agentrl_cli.runtime.rollout.sampler import Draw
    from agentrl_cli.run.training_run import supervised
    from harnesses.canaries import canary_tasks

    t0 = time.perf_counter()

    async def probe(training) -> dict:
        """Run again on a resumed run after a trainer crash (`supervised`): it continues to its steps."""
        tasks = eval_tasks(cfg, cfg.verify.eval_tasks_per_family)
        progress("evaluating before training")
        await training.evaluate(tasks)  # greedy success per harness, a row of metrics.jsonl
        report = lambda row: progress(f"verify run step {row['step']}: reward {row.get('reward/mean')}")  # noqa: E731
        await training.run(MIN_STEPS, on_step=report)
        left = deadline_s - (time.perf_counter() - t0)
        if left > 0:
            # evaluated along the way too: the convergence layer fits a line through the whole curve
            await training.run(10 ** 6, deadline_s=left, on_step=report, eval_tasks=tasks,
                               eval_every=cfg.stages.short_eval_every_steps)
        progress("evaluating after training")
        await training.evaluate(tasks)  # greedy success per harness, a row of metrics.jsonl
        progress("playing the canaries")
        canaries = []
        for i, task in enumerate(t for h in cfg.harnesses for t in canary_tasks(h.name)):
            _, scored, _ = await training.controller.play(Draw(task, f"canary-{i}", 0, i), temperature=0.0, store=False)
            canaries.append({"task": task.task_id, "reward": scored.reward, "outcome_score": scored.components.get("outcome"),
                             "outcome": scored.outcome, "status": scored.status})
        progress("playing tasks twice with the same seed")
        repeats = []
        picks = [t for ts in tasks.values() for t in ts[:1]][:REPEAT_TASKS]
        for i, task in enumerate(picks):
            rewards = []
            for _ in range(2):
                _, scored, _ = await training.controller.play(Draw(task, f"repeat-{i}", 0, 7), temperature=0.0, store=False)
                rewards.append(scored.reward)
            repeats.append({"task_id": task.task_id, "rewards": rewards})
        return {"steps": training.step, "canaries": canaries, "repeats": repeats}
    extra = await supervised(cfg, workdir, path, probe, run_id=run_id, phase=Phase.VERIFY, progress=progress, kept=kept)
    restarts = [{k: v for k, v in row.items() if k.startswith(("restart/", "run/"))} for row in _restart_rows(workdir)]
    return {**extra, "trainer_restarts": restarts}


def _restart_rows(workdir: Path) -> list[dict]:
    """The trainer restarts the verification run recorded in its metrics.jsonl."""
    from agentrl_cli.runtime.observe import keys

    path = workdir / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()] if path.is_file() else []
    return [r for r in rows if r.get(keys.EVENT) == keys.TRAINER_RESTART]


def _resume(cfg, path: Path, workdir: Path, run_id: str, progress, kept) -> dict:
    """Copy the newest checkpoint into a fresh directory, start a run there that resumes from it
    (on the servers the verification run `kept`), and take one step."""
    from agentrl_cli.config.load import with_overrides
    from agentrl_cli.run.training_run import train
    from agentrl_cli.learner.checkpoint import CheckpointManager

    latest = CheckpointManager(workdir / "checkpoints").latest()
    if latest is None:
        return {"ok": False, "why": "the verification run wrote no checkpoint"}
    step = int(latest.name.split("-")[1])
    resume_dir = workdir / "resume"
    shutil.copytree(workdir / "checkpoints", resume_dir / "checkpoints")
    cfg = with_overrides(cfg, {"training.resume_from_latest": True}, "verify's resume probe")
    s = asyncio.run(train(cfg, resume_dir, path, step + 1, run_id=run_id, phase=Phase.VERIFY_RESUME, progress=progress,
                          kept=kept))
    ok = s.resumed_from == latest.name and s.start_step == step and s.steps == step + 1
    return {"ok": ok, "checkpoint": latest.name, "resumed_from": s.resumed_from, "start_step": s.start_step, "end_step": s.steps}


def baseline_loop(cfg, run, progress, *, as_baseline: bool) -> str:
    """Measure the stage-0 loop: as the run's baseline.json (none existed) or as verify/probe.json."""
    from agentrl_cli.acceptance.baseline import measure

    where = run.path / ("stage0" if as_baseline else "verify/probe")
    _, figures = measure(cfg, where, run.run_id, progress, phases=False)
    target = run.path / ("baseline.json" if as_baseline else "verify/probe.json")
    atomic_write_text(target, json.dumps(figures, indent=2) + "\n")
    if as_baseline:
        return (f"no stage-0 baseline on this machine: verify measured one ({target}); later verify runs compare with it")
    return f"measured the stage-0 loop again ({target}) to compare with the baseline"
