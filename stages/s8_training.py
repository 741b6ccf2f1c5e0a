"""Stage 8 - training, in three phases (`agentrl stage run 8 --phase smoke|short|full`).

smoke: `stages.smoke_steps` GRPO steps; every loss finite; the reward distribution neither
constant nor all maximal; a checkpoint written; a second run on the same directory resumes from it
at the same step and sampler position and continues (on the first run's inference servers, brought to
the checkpoint's weights: `agentrl_cli/run/kept_servers.py`); no trajectory id stored twice.
short: train on the training harnesses for `stages.short_minutes` (or `training.total_steps`, whichever
comes first) with `stages.short_recipe` applied
on top of the config (null: the config as it is); greedy eval-split success
before and after (and periodically: the curve) on the training harnesses and the held-out one
(EVAL_TASKS_PER_FAMILY tasks of every task family);
the training harnesses must gain `stages.short_min_success_gain`; the held-out harness must not
fall behind them by more than `verify.cross_harness_max_drop` during training; at least MIN_SHORT_STEPS steps trained; entropy neither collapses nor
explodes (medians of the first and last tenth of the steps); gradient norm stays finite and bounded.
full: `training.total_steps` (or `stages.full_minutes`, whichever comes first) with periodic checkpoints, resume
from the latest and evaluations every `stages.short_eval_every_steps` (the curve verify's convergence layer reads
as it reads short's), judged as a long run that kept learning: the last third of the training harnesses' eval
curve within `stages.full_max_success_drop` of its best third, entropy above `stages.full_min_entropy` (or,
unset, short's trend rule), gradient norms bounded, every held-out harness's last third not below its start; it starts only after a passing short run and stage 0 baseline of the same configuration
(`agentrl_cli/acceptance/phase_order.py`: the "earlier phases" check), or with `--force` (recorded in that check and
as `forced_order` in the report's environment).

Every phase restarts its run after a trainer crash, up to `training.max_restarts` (`run.supervised`);
a run that restarted gets an info check "trainer restarts" naming each restart's cause.
"""

from __future__ import annotations

import asyncio
import math
import statistics
from pathlib import Path

from agentrl_cli.acceptance.context import StageContext
from agentrl_cli.runtime.observe import keys
from agentrl_cli.core.outcomes import STAGE8_PHASES, Phase
from agentrl_cli.core.report import Check, CheckStatus, StageReport
from agentrl_cli.run.kept_servers import KeptServers
from agentrl_cli.run.training_run import RunSummary
from agentrl_cli.acceptance.verify.judge import UNMEASURABLE, achievable_max_reward, entropy_trend, gap_widening, grad_norm_stable

__all__ = ["run", "entropy_trend"]

EVAL_TASKS_PER_FAMILY = 12
MIN_SHORT_STEPS = 5  # the entropy trend compares windows of at least 5 steps


def run(ctx: StageContext) -> StageReport:
    phase = ctx.options.phase
    if phase not in STAGE8_PHASES:
        return ctx.report([Check("phase", CheckStatus.FAIL, phase, ", ".join(STAGE8_PHASES), f"unknown phase {phase!r}",
                                 "agentrl stage run 8 --phase smoke")])
    checks, path = ctx.produce("model", lambda: _model(ctx))
    if path is None:
        return ctx.report(checks + [Check.skipped("training", "no model; see above")])
    phases = {Phase.SMOKE: _smoke, Phase.SHORT: _short, Phase.FULL: _full}
    environment = {"phase": phase, **({"forced_order": True} if phase == Phase.FULL and ctx.options.force else {})}
    return ctx.report(checks + phases[phase](ctx, path), environment=environment)


def _model(ctx: StageContext) -> tuple[Check, Path]:
    from agentrl_cli.model.resolve import resolve_model_path

    ctx.progress("resolving the model (the built-in one is installed from the package on first use)")
    path = resolve_model_path(ctx.config.model.path, ctx.config.model.cache_dir)
    return Check("model", CheckStatus.PASS, str(path), "resolves to a model directory"), path


def _train(ctx, cfg, path, steps: int, **kw):
    from agentrl_cli.run.training_run import train

    return asyncio.run(train(cfg, ctx.run.path / "stage8", path, steps, run_id=ctx.run.run_id, phase=ctx.options.phase,
                             progress=ctx.progress,
                             on_step=lambda row: ctx.progress(_step_line(row, steps, kw.get("deadline_s"))), **kw))


def _step_line(row: dict, steps: int, deadline_s: float | None) -> str:
    """One progress line per trainer step: step, loss, reward, the latest evaluation and time left
    (to `steps` at the pace so far, or to the deadline when that comes first)."""
    elapsed, step = row.get(keys.ELAPSED_S) or 0.0, row[keys.STEP]
    left = elapsed / max(1, step) * max(0, steps - step) if steps < 10 ** 6 else float("inf")
    if deadline_s is not None:
        left = min(left, max(0.0, deadline_s - elapsed))
    evals = {keys.eval_harness(k): v for k, v in row.items() if keys.eval_harness(k)}
    loss, reward = row.get(keys.TRAIN_LOSS), row.get(keys.REWARD_MEAN)
    parts = [f"step {step}/{steps}" if steps < 10 ** 6 else f"step {step}",
             f"loss {loss:.4f}" if isinstance(loss, float) else "loss n/a",
             f"reward {reward:.3f}" if isinstance(reward, float) else "reward n/a"]
    if evals:
        parts.append("eval " + ", ".join(f"{h} {v:.2f}" for h, v in evals.items()))
    if left != float("inf"):
        parts.append(f"about {left / 60:.1f} min left")
    return ", ".join(parts)


def _smoke(ctx: StageContext, path) -> list[Check]:
    steps = ctx.config.stages.smoke_steps
    interval = max(1, min(ctx.config.training.checkpoint_interval_steps, steps // 2))
    cfg = ctx.derive({"training.checkpoint_interval_steps": interval, "training.resume_from_latest": True}, "stage 8 smoke")
    kept = KeptServers()  # the resumed run takes the first run's inference servers: no second model load
    try:
        return _smoke_runs(ctx, cfg, path, steps, kept)
    finally:
        kept.close()


def _smoke_runs(ctx: StageContext, cfg, path, steps: int, kept: KeptServers) -> list[Check]:
    checks, a = ctx.produce("loss finite", lambda: _first_smoke_run(ctx, cfg, path, steps, kept))
    if a is None:
        return checks + [Check.skipped("smoke checks", "the first run failed; see above")]
    rewards = [m.get(keys.REWARD_MEAN) for m in a.metrics if m.get(keys.REWARD_MEAN) is not None]
    stds = [m.get(keys.REWARD_STD) or 0.0 for m in a.metrics]
    top = achievable_max_reward(cfg.reward.weights)
    degenerate = not rewards or (max(stds) == 0.0 and len(set(rewards)) <= 1)
    all_max = bool(rewards) and min(rewards) >= top * 0.999 and max(stds) == 0
    checks.append(Check.judge("reward distribution not degenerate", not degenerate and not all_max,
                              {"mean_first": _r(rewards[:1]), "mean_last": _r(rewards[-1:]), "max_group_std": _r([max(stds)]),
                               "achievable_max": round(top, 4)},
                              "rewards vary within groups (GRPO has a signal)", "tasks too easy or too hard for the model: "
                              "check the reward (stage 6) and the curriculum (rollout.curriculum)"))
    checks += _role_rewards(a)
    checks.append(Check.judge("checkpoint written", bool(a.checkpoints), a.checkpoints, "at least one complete checkpoint",
                              "see training.checkpoint_interval_steps and the checkpoints directory"))
    checks += _restarts(a)
    checks.append(ctx.check("reloaded and resumed", lambda: _resume(ctx, cfg, path, steps, a, kept)))
    checks.append(ctx.check("no trajectory stored twice", lambda: _unique_ids(ctx)))
    checks.append(_pools_clean(a))
    checks += _backpressure(a)
    return checks


def _backpressure(a: RunSummary) -> list[Check]:
    """An info check per harness whose environment's server refused sessions at capacity: the
    refusals waited out (`env/<harness>/backpressure`) and the capacity learnt; none when none refused."""
    import re

    refused = {m.group(1): v for k, v in a.counters.items() if (m := re.match(r"^env/([^/]+)/backpressure$", k))}
    if not refused:
        return []
    measured = {h: {"refusals": n, "capacity": a.counters.get(keys.env_capacity(h))} for h, n in sorted(refused.items())}
    return [Check.info("environment backpressure", measured, "sessions the environment's server refused at capacity, "
                       "waited out and replayed (not harness errors); the run capped the harness at the capacity the "
                       "server named. Raise the server's session limit to play more episodes at once")]


def _role_rewards(a: RunSummary) -> list[Check]:
    """An info check with each role's reward curve (`reward/role/<role>/mean` by step) when the run
    trained a multi-agent harness; none otherwise."""
    import re

    roles = sorted({m.group(1) for row in a.metrics for k in row if (m := re.match(keys.REWARD_ROLE_PATTERN, k))})
    if not roles:
        return []
    curves = {role: [[row.get(keys.STEP), round(row[keys.reward_role(role)], 4)] for row in a.metrics
                     if isinstance(row.get(keys.reward_role(role)), (int, float))] for role in roles}
    return [Check.info("rewards per role", curves, "each role's batch mean reward by step ([step, mean]); "
                       "`reward/role/<role>/mean` in metrics.jsonl")]


def _pools_clean(a: RunSummary) -> Check:
    leaks = {k: v for k, v in a.counters.items() if k in ("sandbox/leaked_processes", "sandbox/leftover_dirs")}
    if not leaks:
        return Check.skipped("sandbox pools left nothing", "no harness of this run took sandboxes from a local pool "
                             "(sandbox.service_url, or harnesses without sandboxes)", "0 leaked processes, 0 leftover dirs")
    acquired = sum(v for k, v in a.counters.items() if k.startswith("sandbox/") and k.endswith("/acquired"))
    return Check.judge("sandbox pools left nothing", not any(leaks.values()), {**leaks, "sandboxes_acquired": acquired},
                       "0 leaked processes, 0 leftover dirs", "a sandbox outlived its pool: run `agentrl sandbox check` "
                       "and see docs/security.md row 4")


def _first_smoke_run(ctx, cfg, path, steps: int, kept: KeptServers) -> tuple[Check, RunSummary]:
    summary = _train(ctx, cfg, path, steps, kept=kept)
    losses = [m.get(keys.TRAIN_LOSS) for m in summary.metrics]
    ok = len(losses) == steps and all(isinstance(x, float) and math.isfinite(x) for x in losses)
    measured = {"steps": len(losses), "first": _r(losses[:1]), "last": _r(losses[-1:])}
    untrained = [m.get(keys.STEP) for m in summary.metrics if m.get(keys.TRAIN_LOSS) is None]
    fix = "lower training.learning_rate; see metrics.jsonl"
    if untrained:  # no loss because nothing reached the trainer: say so rather than report a bare None
        measured["steps_without_samples"] = untrained
        measured["masked_episodes"] = sum(m.get(keys.REWARD_MASKED) or 0 for m in summary.metrics
                                          if m.get(keys.TRAIN_LOSS) is None)
        fix = ("these steps trained nothing: every episode of their batch was masked (infra errors, truncation: mask, "
               "or a role that never got the turn) or dynamic sampling skipped them; see reward/masked and "
               "rollout/samples_built in metrics.jsonl")
    return Check.judge("loss finite", ok, measured, f"{steps} steps, every loss finite", fix), summary


def _resume(ctx, cfg, path, steps: int, a: RunSummary, kept: KeptServers) -> Check:
    b = _train(ctx, cfg, path, steps + 2, kept=kept)
    ok = b.resumed_from == a.checkpoints[-1] and b.start_step == a.steps and b.steps == steps + 2
    measured = {"resumed_from": b.resumed_from, "start_step": b.start_step, "end_step": b.steps}
    if b.restarts:
        measured["trainer_restarts"] = _restart_list(b)
    return Check.judge("reloaded and resumed", ok, measured, f"resumes at step {a.steps} and continues",
                       "resume_from_latest is off or the checkpoint does not load")


def _restart_list(s: RunSummary) -> list[dict]:
    return [{"cause": r[keys.RESTART_CAUSE], "last_step": r[keys.RESTART_LAST_STEP], "from": r[keys.RESTART_FROM],
             "error": r[keys.RESTART_ERROR]} for r in s.restarts]


def _restarts(s: RunSummary) -> list[Check]:
    """An info check naming each trainer restart of the run and its cause; none when it did not restart."""
    if not s.restarts:
        return []
    causes = ", ".join(r[keys.RESTART_CAUSE] for r in s.restarts)
    return [Check("trainer restarts", CheckStatus.INFO, _restart_list(s), "training.max_restarts bounds them",
                  f"the trainer crashed {len(s.restarts)} time(s) ({causes}) and the run resumed from its latest checkpoint",
                  "see the trainer's log under the run's logs/ for the crash")]


def _unique_ids(ctx) -> Check:
    from agentrl_cli.runtime.data.query import filter_table
    from agentrl_cli.runtime.data.stores import open_store

    table = filter_table(open_store(ctx.config.data).read_table(), f"run_id == {ctx.run.run_id!r}")
    ids = table.column("trajectory_id").to_pylist()
    return Check.judge("no trajectory stored twice", len(ids) == len(set(ids)) and ids, {"stored": len(ids), "unique": len(set(ids))},
                       "every stored trajectory id once", "the rollout wrote a trajectory twice after resume")


def _eval_tasks(cfg) -> dict:
    """Per harness, EVAL_TASKS_PER_FAMILY eval-split tasks of each task family, spread evenly over the
    family (so every difficulty is in): each family weighs the same in the harness's success rate."""
    from harnesses.task_sources import task_set

    out = {}
    for h in cfg.harnesses:
        by_family: dict[str, list] = {}
        for t in task_set(h, cfg.data).select("eval"):
            by_family.setdefault(t.meta.get("family", ""), []).append(t)
        out[h.name] = [t for tasks in by_family.values()
                       for t in tasks[::max(1, len(tasks) // EVAL_TASKS_PER_FAMILY)][:EVAL_TASKS_PER_FAMILY]]
    return out


def _short(ctx: StageContext, path) -> list[Check]:
    recipe = ctx.config.stages.short_recipe
    cfg = ctx.derive(recipe or {}, "stages.short_recipe")
    checks, s = ctx.produce("trained", lambda: _short_run(ctx, cfg, path, recipe))
    if s is None or len(s.evals) < 2:
        return checks + [Check.skipped("short checks", "training did not complete; see above")]
    checks += _restarts(s)
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
    for n in held:
        measured = gap_widening([(before[t]["success_rate"], after[t]["success_rate"]) for t in train_names],
                                (before[n]["success_rate"], after[n]["success_rate"]))
        if not measured.pop("measurable"):
            checks.append(Check.skipped(f"held-out harness {n} (never trained on)", UNMEASURABLE.format(name=n)))
            continue
        checks.append(Check.judge(f"held-out harness {n} (never trained on)", measured["drop"] <= cfg.verify.cross_harness_max_drop,
                                  measured, f"falls behind the training harnesses by at most {cfg.verify.cross_harness_max_drop:g} "
                                  "during training (their gain minus its own)",
                                  "the policy learned interface conventions: adjust harnesses[].weight, unify prompt and "
                                  "tool-description style, add environment variety"))
    ok_entropy, measured = entropy_trend([m.get(keys.TRAIN_ENTROPY) for m in s.metrics if m.get(keys.TRAIN_ENTROPY) is not None])
    checks.append(Check.judge("entropy neither collapses nor explodes", ok_entropy, measured,
                              "median of the last steps within 0.1x-10x of the first steps'",
                              "lower training.learning_rate or add training.entropy_coef"))
    ok_norm, measured = grad_norm_stable([m.get(keys.TRAIN_GRAD_NORM) for m in s.metrics if m.get(keys.TRAIN_GRAD_NORM) is not None])
    checks.append(Check.judge("gradient norm stable", ok_norm, measured, "finite, max <= 100x median",
                              "lower training.learning_rate or training.max_grad_norm"))
    return checks


def _short_run(ctx, cfg, path, recipe) -> tuple[Check, RunSummary]:
    minutes = ctx.config.stages.short_minutes
    # whichever comes first: stages.short_minutes or training.total_steps
    s = _train(ctx, cfg, path, steps=cfg.training.total_steps, deadline_s=minutes * 60, eval_tasks=_eval_tasks(cfg),
               eval_every=cfg.stages.short_eval_every_steps)
    trained = [m for m in s.metrics if m.get(keys.TRAIN_SAMPLES)]
    return Check.judge("trained", len(trained) >= MIN_SHORT_STEPS and len(s.evals) >= 2,
                       {"steps": s.steps, "steps_with_samples": len(trained), "evaluations": len(s.evals),
                        "minutes": minutes, "recipe": recipe},
                       f">= {MIN_SHORT_STEPS} steps that trained on samples within {minutes:g} minutes, evaluated before and after",
                       "too few steps for the trend checks: raise stages.short_minutes, or lower rollout.group_size / "
                       "training.micro_batch_size so a step takes less time"), s


def _full(ctx: StageContext, path) -> list[Check]:
    from agentrl_cli.acceptance.phase_order import find_earlier

    cfg = ctx.config
    order = find_earlier(ctx.loaded.resolved(), Path(cfg.observe.runs_dir)).check(ctx.options.force)
    if order.status == CheckStatus.FAIL:
        return [order, Check.skipped("full run", "not started: stage 8 runs smoke -> short -> full; see above")]
    summaries: list[RunSummary] = []
    minutes = cfg.stages.full_minutes
    steps = cfg.training.total_steps

    def go() -> Check:
        s = _train(ctx, cfg, path, steps, eval_tasks=_eval_tasks(cfg), eval_every=cfg.stages.short_eval_every_steps,
                   deadline_s=minutes * 60 if minutes is not None else None)
        summaries.append(s)
        budget = f"{steps} steps" + (f" or {minutes:g} minutes, whichever comes first," if minutes is not None else "")
        ok = (s.steps == steps or (minutes is not None and s.steps > s.start_step)) and bool(s.checkpoints)
        return Check.judge("full run", ok, {"steps": s.steps, "start_step": s.start_step, "resumed_from": s.resumed_from,
                                            "minutes": minutes, "checkpoints": s.checkpoints[-3:], "evals": s.evals[-1:]},
                           f"{budget} with periodic checkpoints",
                           "rerun the same command to resume from the latest checkpoint")
    checks = [order, ctx.check("full run", go)]
    if not summaries:
        return checks
    return checks + _restarts(summaries[0]) + _stability(cfg, summaries[0])


def _thirds(values: list[float]) -> list[list[float]]:
    """`values` in three consecutive parts as even as they go (the middle one takes what is left)."""
    n = len(values) // 3
    return [values[:n], values[n:len(values) - n], values[len(values) - n:]]


def _stability(cfg, s: RunSummary) -> list[Check]:
    """A long run that kept learning: the training harnesses' eval success held at its best, entropy
    above its floor, gradient norms bounded, every held-out harness not below its start."""
    train_names = [h.name for h in cfg.harnesses if not h.held_out]
    held = [h.name for h in cfg.harnesses if h.held_out]
    curve = [statistics.fmean(e[n]["success_rate"] for n in train_names) for e in s.evals if all(n in e for n in train_names)]
    checks = []
    drop = cfg.stages.full_max_success_drop
    if len(curve) < 3:
        checks.append(Check.skipped("eval success holds", f"{len(curve)} evaluations; the thirds of the curve need at least 3 "
                                    "(raise stages.full_minutes or lower stages.short_eval_every_steps)"))
    else:
        thirds = [statistics.fmean(part) for part in _thirds(curve)]
        best, last = max(thirds), thirds[-1]
        checks.append(Check.judge("eval success holds", last >= best - drop - 1e-9,
                                  {"thirds": [round(x, 3) for x in thirds], "best_third": round(best, 3), "last_third": round(last, 3),
                                   "evaluations": len(curve), "curve": [round(x, 3) for x in curve]},
                                  f"the last third's mean eval success within {drop:g} of the best third's, on the training harnesses",
                                  "the policy learned and then lost it: lower training.learning_rate, set training.entropy_target, "
                                  "or stop earlier (stages.full_minutes); `agentrl troubleshoot entropy-collapse-or-explosion`"))
    entropy = [m[keys.TRAIN_ENTROPY] for m in s.metrics if m.get(keys.TRAIN_ENTROPY) is not None]
    floor = cfg.stages.full_min_entropy
    if floor is None:
        ok, measured = entropy_trend(entropy)
        checks.append(Check.judge("entropy neither collapses nor explodes", ok, measured,
                                  "median of the last steps within 0.1x-10x of the first steps'",
                                  "lower training.learning_rate, add training.entropy_coef or set training.entropy_target"))
    elif len(entropy) < 5:
        checks.append(Check.skipped("entropy stays above its floor", f"{len(entropy)} steps logged entropy; the windows need 5"))
    else:
        medians = [statistics.median(entropy[i:i + 5]) for i in range(len(entropy) - 4)]
        low = min(range(len(medians)), key=medians.__getitem__)
        checks.append(Check.judge("entropy stays above its floor", medians[low] >= floor,
                                  {"lowest_5_step_median": round(medians[low], 4), "at_step_window": [low + 1, low + 5],
                                   "first": round(medians[0], 4), "last": round(medians[-1], 4), "steps": len(entropy)},
                                  f"the median of every 5 consecutive steps >= stages.full_min_entropy = {floor:g}",
                                  "set training.entropy_target at or above the floor (adaptive entropy control), or lower "
                                  "training.learning_rate"))
    ok, measured = grad_norm_stable([m[keys.TRAIN_GRAD_NORM] for m in s.metrics if m.get(keys.TRAIN_GRAD_NORM) is not None])
    checks.append(Check.judge("gradient norm stable", ok, measured, "finite, max <= 100x median",
                              "lower training.learning_rate or training.max_grad_norm"))
    for n in held:
        rates = [e[n]["success_rate"] for e in s.evals if n in e]
        if len(rates) < 3:
            checks.append(Check.skipped(f"held-out harness {n} not below its start", f"{len(rates)} evaluations; need at least 3"))
            continue
        last = statistics.fmean(_thirds(rates)[-1])
        checks.append(Check.judge(f"held-out harness {n} not below its start", last >= rates[0] - 1e-9,
                                  {"start": round(rates[0], 3), "last_third": round(last, 3), "curve": [round(x, 3) for x in rates]},
                                  "the mean of the last third of its evaluations >= its first (never trained on)",
                                  "the policy traded general skill for the training harnesses: lower training.learning_rate, "
                                  "set training.kl_coef, or add harness variety"))
    return checks


def _r(values):
    return round(values[0], 4) if values and isinstance(values[0], (int, float)) else None
