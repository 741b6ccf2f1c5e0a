"""Stage 8 - training, in three phases (`agentrl stage run 8 --phase smoke|short|full`).

smoke: `stages.smoke_steps` GRPO steps; every loss finite; the reward distribution neither
constant nor all maximal; a checkpoint written; a second run on the same directory resumes from it
at the same step and sampler position and continues; no trajectory id stored twice.
short: train on the training harnesses for `stages.short_minutes` with `stages.short_recipe` applied
on top of the config (null: the config as it is); greedy eval-split success
before and after (and periodically: the curve) on the training harnesses and the held-out one
(EVAL_TASKS_PER_FAMILY tasks of every task family);
the training harnesses must gain `stages.short_min_success_gain`; entropy neither collapses nor
explodes (medians of the first and last tenth of the steps); gradient norm stays finite and bounded.
full: `training.total_steps` with periodic checkpoints and resume from the latest.
"""

from __future__ import annotations

import asyncio
import math
import statistics

from agentrl_cli.context import StageContext
from agentrl_cli.report import Check, StageReport

EVAL_TASKS_PER_FAMILY = 12


def run(ctx: StageContext) -> StageReport:
    phase = ctx.options.phase
    if phase not in ("smoke", "short", "full"):
        return ctx.report([Check("phase", "fail", phase, "smoke, short or full", f"unknown phase {phase!r}",
                                 "agentrl stage run 8 --phase smoke")])
    from agentrl_cli.model.resolve import resolve_model_path

    state: dict = {}

    def model() -> Check:
        ctx.progress("resolving the model (the built-in one is built on first use, about 10 minutes on 2 cores)")
        state["path"] = resolve_model_path(ctx.config.model.path, ctx.config.model.cache_dir)
        return Check("model", "pass", str(state["path"]), "resolves to a model directory")

    checks = [ctx.check("model", model)]
    if "path" not in state:
        return ctx.report(checks + [Check.skipped("training", "no model; see above")])
    if phase == "smoke":
        return ctx.report(checks + _smoke(ctx, state["path"]))
    if phase == "short":
        return ctx.report(checks + _short(ctx, state["path"]))
    return ctx.report(checks + _full(ctx, state["path"]))


def _train(ctx, cfg, path, steps: int, **kw):
    from agentrl_cli.run import TrainingRun

    async def go():
        training = TrainingRun(cfg, ctx.run.path / "stage8", path, run_id=ctx.run.run_id, phase=ctx.options.phase,
                               progress=ctx.progress)
        try:
            await training.start()
            return await training.run(steps, on_step=lambda row: ctx.progress(
                f"step {row['step']}: loss {row.get('train/loss')}, reward {row.get('reward/mean')}"), **kw)
        finally:
            await training.close()
    return asyncio.run(go())


def _smoke(ctx: StageContext, path) -> list[Check]:
    cfg = ctx.config
    steps = cfg.stages.smoke_steps
    interval = max(1, min(cfg.training.checkpoint_interval_steps, steps // 2))
    cfg = cfg.model_copy(update={"training": cfg.training.model_copy(update={"checkpoint_interval_steps": interval,
                                                                            "resume_from_latest": True})})
    state: dict = {}

    def first() -> Check:
        state["a"] = _train(ctx, cfg, path, steps)
        losses = [m.get("train/loss") for m in state["a"].metrics]
        ok = len(losses) == steps and all(isinstance(x, float) and math.isfinite(x) for x in losses)
        return Check.judge("loss finite", ok, {"steps": len(losses), "first": _r(losses[:1]), "last": _r(losses[-1:])},
                           f"{steps} steps, every loss finite", "lower training.learning_rate; see metrics.jsonl")

    checks = [ctx.check("loss finite", first)]
    a = state.get("a")
    if a is None:
        return checks + [Check.skipped("smoke checks", "the first run failed; see above")]
    rewards = [m.get("reward/mean") for m in a.metrics if m.get("reward/mean") is not None]
    stds = [m.get("reward/std") or 0.0 for m in a.metrics]
    degenerate = not rewards or (max(stds) == 0.0 and len(set(rewards)) <= 1)
    all_max = bool(rewards) and min(rewards) >= max(cfg.reward.weights.values(), default=1.0) * 0.999 and max(stds) == 0
    checks.append(Check.judge("reward distribution not degenerate", not degenerate and not all_max,
                              {"mean_first": _r(rewards[:1]), "mean_last": _r(rewards[-1:]), "max_group_std": _r([max(stds)])},
                              "rewards vary within groups (GRPO has a signal)", "tasks too easy or too hard for the model: "
                              "check the reward (stage 6) and the curriculum (rollout.curriculum)"))
    checks.append(Check.judge("checkpoint written", bool(a.checkpoints), a.checkpoints, "at least one complete checkpoint",
                              "see training.checkpoint_interval_steps and the checkpoints directory"))

    def resume() -> Check:
        b = _train(ctx, cfg, path, steps + 2)
        ok = b.resumed_from == a.checkpoints[-1] and b.start_step == a.steps and b.steps == steps + 2
        return Check.judge("reloaded and resumed", ok, {"resumed_from": b.resumed_from, "start_step": b.start_step,
                                                        "end_step": b.steps}, f"resumes at step {a.steps} and continues",
                           "resume_from_latest is off or the checkpoint does not load")
    checks.append(ctx.check("reloaded and resumed", resume))
    checks.append(ctx.check("no trajectory stored twice", lambda: _unique_ids(ctx)))
    return checks


def _unique_ids(ctx) -> Check:
    from agentrl_cli.data.query import filter_table
    from agentrl_cli.data.stores import open_store

    table = filter_table(open_store(ctx.config.data).read_table(), f"run_id == {ctx.run.run_id!r}")
    ids = table.column("trajectory_id").to_pylist()
    return Check.judge("no trajectory stored twice", len(ids) == len(set(ids)) and ids, {"stored": len(ids), "unique": len(set(ids))},
                       "every stored trajectory id once", "the rollout wrote a trajectory twice after resume")


def _eval_tasks(cfg) -> dict:
    """Per harness, EVAL_TASKS_PER_FAMILY eval-split tasks of each task family, spread evenly over the
    family (so every difficulty is in): each family weighs the same in the harness's success rate."""
    from harnesses.tasks import load_tasks

    out = {}
    for h in cfg.harnesses:
        by_family: dict[str, list] = {}
        for t in load_tasks(h.name, "eval"):
            by_family.setdefault(t.meta.get("family", ""), []).append(t)
        out[h.name] = [t for tasks in by_family.values()
                       for t in tasks[::max(1, len(tasks) // EVAL_TASKS_PER_FAMILY)][:EVAL_TASKS_PER_FAMILY]]
    return out


def _short(ctx: StageContext, path) -> list[Check]:
    from agentrl_cli.config.load import with_overrides

    minutes = ctx.config.stages.short_minutes
    recipe = ctx.config.stages.short_recipe
    state: dict = {"cfg": ctx.config}

    def go() -> Check:
        cfg = state["cfg"] = with_overrides(ctx.config, recipe, "stages.short_recipe") if recipe else ctx.config
        s = _train(ctx, cfg, path, steps=10 ** 6, deadline_s=minutes * 60, eval_tasks=_eval_tasks(cfg),
                   eval_every=cfg.stages.short_eval_every_steps)
        state["s"] = s
        return Check("trained", "pass", {"steps": s.steps, "minutes": minutes, "recipe": recipe},
                     f"trains for {minutes:g} minutes")

    checks = [ctx.check("trained", go)]
    s, cfg = state.get("s"), state["cfg"]
    if s is None or len(s.evals) < 2:
        return checks + [Check.skipped("short checks", "training did not complete; see above")]
    train_names = [h.name for h in cfg.harnesses if not h.held_out]
    held = [h.name for h in cfg.harnesses if h.held_out]
    before, after = s.evals[0], s.evals[-1]
    rate = lambda e, names: statistics.fmean(e[n]["success_rate"] for n in names) if names else None  # noqa: E731
    gain = rate(after, train_names) - rate(before, train_names)
    curve = [{"step": e["step"], **{n: round(e[n]["success_rate"], 3) for n in train_names + held}} for e in s.evals]
    checks.append(Check.judge("eval success rises on the training harnesses", gain >= cfg.stages.short_min_success_gain,
                              {"before": round(rate(before, train_names), 3), "after": round(rate(after, train_names), 3),
                               "gain": round(gain, 3), "curve": curve,
                               "by_family": {n: {"before": before[n].get("by_family"), "after": after[n].get("by_family")}
                                             for n in train_names}},
                              f"gain >= {cfg.stages.short_min_success_gain:g}", "see metrics.jsonl: reward, entropy, "
                              "mismatch_kl; raise stages.short_minutes or training.learning_rate"))
    if held:
        checks.append(Check("held-out harness (never trained on)", "pass",
                            {n: {"before": round(before[n]["success_rate"], 3), "after": round(after[n]["success_rate"], 3)} for n in held},
                            "reported before and after", "reported only: the cross-harness judgement is in `agentrl verify`"))
    entropy = [m.get("train/entropy") for m in s.metrics if m.get("train/entropy") is not None]
    ok_entropy, measured = entropy_trend(entropy)
    checks.append(Check.judge("entropy neither collapses nor explodes", ok_entropy, measured,
                              "median of the last steps within 0.1x-10x of the first steps'",
                              "lower training.learning_rate or add training.entropy_coef"))
    norms = [m.get("train/grad_norm") for m in s.metrics if m.get("train/grad_norm") is not None]
    finite = bool(norms) and all(math.isfinite(x) for x in norms)
    bounded = finite and max(norms) <= 100 * max(statistics.median(norms), 1e-6)
    checks.append(Check.judge("gradient norm stable", finite and bounded, {"median": _r([statistics.median(norms)]) if norms else None,
                                                                          "max": _r([max(norms)]) if norms else None},
                              "finite, max <= 100x median", "lower training.learning_rate or training.max_grad_norm"))
    return checks


def entropy_trend(entropy: list[float]) -> tuple[bool, dict]:
    """(ok, measured): the median entropy of the last window within 0.1x-10x of the first window's;
    a window is a tenth of the steps, at least 5. One step's entropy depends on which tasks the
    curriculum drew (seen: 0.23 and 0.01 four steps apart), so the trend is judged on medians, not
    on two single steps. No entropy logged is not ok."""
    if not entropy:
        return False, {"first": None, "last": None, "window_steps": 0}
    window = min(len(entropy), max(5, len(entropy) // 10))
    first, last = statistics.median(entropy[:window]), statistics.median(entropy[-window:])
    return 0.1 * first < last < 10 * max(first, 1e-6), {"first": _r([first]), "last": _r([last]), "window_steps": window}


def _full(ctx: StageContext, path) -> list[Check]:
    cfg = ctx.config

    def go() -> Check:
        s = _train(ctx, cfg, path, cfg.training.total_steps, eval_tasks=_eval_tasks(cfg))
        ok = s.steps == cfg.training.total_steps and bool(s.checkpoints)
        return Check.judge("full run", ok, {"steps": s.steps, "start_step": s.start_step, "resumed_from": s.resumed_from,
                                            "checkpoints": s.checkpoints[-3:], "evals": s.evals[-1:]},
                           f"{cfg.training.total_steps} steps with periodic checkpoints",
                           "rerun the same command to resume from the latest checkpoint")
    return [ctx.check("full run", go)]


def _r(values):
    return round(values[0], 4) if values and isinstance(values[0], (int, float)) else None
