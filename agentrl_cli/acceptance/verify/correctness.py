"""Verify layer 2, correctness: losses finite and of sane magnitude; the reward distribution neither
constant nor mostly at the achievable maximum (from the reward weights); a complete checkpoint that
a resumed run loaded and stepped from; checkpoints of earlier format versions (fixtures kept with
agentrl) still loading; repeated tasks scoring the same; and reward-integrity
canaries scoring 0, both the answers a cheating agent would try (scored now through the configured
reward) and the policy's own attempts (from verify's run).
"""

from __future__ import annotations

import math
import statistics

from agentrl_cli.core.outcomes import Outcome, RewardStatus
from agentrl_cli.runtime.observe import keys
from agentrl_cli.core.report import Check, CheckStatus
from agentrl_cli.acceptance.verify.judge import achievable_max_reward

LOSS_MAX_ABS = 100.0  # a GRPO loss is an advantage-weighted ratio: of order 1, never hundreds
# nearly every trajectory at the top: the reward pays for something other than the task. A policy that
# has learned its tasks legitimately sits well above half; the canaries are the test for cheating.
MAX_FRACTION_LIMIT = 0.9


def loss_check(rec) -> Check:
    name = "loss finite and of sane magnitude"
    losses = [r.get(keys.TRAIN_LOSS) for r in rec.rows]
    if not losses:
        return Check.skipped(name, "no trainer step recorded")
    bad = [(r[keys.STEP], r.get(keys.TRAIN_LOSS)) for r in rec.rows
           if not isinstance(r.get(keys.TRAIN_LOSS), (int, float)) or not math.isfinite(r[keys.TRAIN_LOSS])]
    big = max((abs(x) for x in losses if isinstance(x, (int, float)) and math.isfinite(x)), default=0.0)
    return Check.judge(name, not bad and big <= LOSS_MAX_ABS,
                       {"steps": len(losses), "not_finite_at": bad[:5], "max_abs": round(big, 4)},
                       f"every loss finite, |loss| <= {LOSS_MAX_ABS:g}",
                       "lower training.learning_rate, keep training.max_grad_norm set; `agentrl troubleshoot loss-nan`")


def reward_distribution_checks(rec, cfg, trajectories: list | None) -> list[Check]:
    top = achievable_max_reward(cfg.reward.weights)
    if trajectories:
        rewards = [t.reward for t in trajectories if t.reward_status != RewardStatus.INFRA_ERROR]
        source = f"{len(rewards)} stored trajectories"
    else:
        rewards = [r[keys.REWARD_MEAN] for r in rec.rows if isinstance(r.get(keys.REWARD_MEAN), (int, float))]
        source = f"{len(rewards)} step means (no stored trajectories)"
    if not rewards:
        return [Check.skipped("reward distribution", "no scored trajectory recorded")]
    if trajectories:
        constant = len({round(x, 9) for x in rewards}) <= 1
        at_top = sum(x >= top * 0.999 for x in rewards) / len(rewards)
    else:
        stds = [r.get(keys.REWARD_STD) or 0.0 for r in rec.rows]
        constant = max(stds) == 0.0 and len({round(x, 9) for x in rewards}) <= 1
        at_top = sum(x >= top * 0.999 for x in rewards) / len(rewards)  # a step mean at the top: all its rewards are
    spread = {"source": source, "mean": round(statistics.fmean(rewards), 4), "min": round(min(rewards), 4),
              "max": round(max(rewards), 4)}
    return [
        Check.judge("reward distribution not constant", not constant, spread, "rewards differ between trajectories",
                    "every trajectory got the same reward: check the reward (stage 6) and that tasks are neither "
                    "all solved nor all failed (rollout.curriculum)"),
        Check.judge("reward not pinned at the achievable maximum", at_top <= MAX_FRACTION_LIMIT,
                    {"fraction_at_max": round(at_top, 3), "achievable_max": round(top, 4), "from_weights": cfg.reward.weights},
                    f"at most {MAX_FRACTION_LIMIT:.0%} of trajectories at the maximum",
                    "review high-reward trajectories by hand (`agentrl data query 'reward>=…'`); an error must score "
                    "low, never a default high score; `agentrl troubleshoot reward-pinned-at-max`"),
    ]


def checkpoint_checks(rec) -> list[Check]:
    from agentrl_cli.learner.checkpoint import CheckpointManager

    out = []
    root = rec.training_dir / "checkpoints" if rec.training_dir else None
    if root is None or not root.is_dir():
        out.append(Check.skipped("checkpoint written and complete", "the run recorded no checkpoint directory"))
    else:
        latest = CheckpointManager(root).latest(verify_hashes=True)
        out.append(Check.judge("checkpoint written and complete", latest is not None,
                               {"latest": latest.name if latest else None, "root": str(root)},
                               "a checkpoint whose files match their recorded hashes",
                               "see training.checkpoint_interval_steps; a checkpoint that fails its hashes is torn or edited"))
    resume = rec.extra.get("resume")
    smoke = rec.reports.get(8)
    recorded = next((c for c in smoke.checks if c.name == "reloaded and resumed"), None) if smoke else None
    if resume:
        out.append(Check.judge("checkpoint loads and training continues from it", bool(resume.get("ok")), resume,
                               "a new run on the directory resumes at the checkpoint's step and takes a step",
                               "the checkpoint does not load: `agentrl troubleshoot checkpoint-unreadable`"))
    elif recorded is not None and recorded.status in (CheckStatus.PASS, CheckStatus.FAIL):
        out.append(Check(f"checkpoint loads and training continues from it (stage 8 {smoke.environment.get('phase', 'smoke')})",
                         recorded.status, recorded.measured, recorded.expected, "as stage 8 recorded it", recorded.hint))
    else:
        out.append(Check.skipped("checkpoint loads and training continues from it",
                                 "neither verify's run nor stage 8 smoke recorded a resume"))
    out.append(old_format_check())
    return out


def old_format_check() -> Check:
    """Checkpoints written by earlier format versions (fixtures kept with agentrl) load and train."""
    from agentrl_cli.acceptance.verify.old_checkpoint import fixtures, load_and_step

    kept = fixtures()
    name = "checkpoints of kept format versions load and train"
    if not kept:
        return Check.skipped(name, "no checkpoint fixture is installed with this agentrl")
    results = {p.name: load_and_step(p) for p in kept}
    return Check.judge(name, all(r["ok"] for r in results.values()), results,
                       "each kept checkpoint loads with this version and takes a finite step",
                       "this version cannot read checkpoints an earlier one wrote: keep a reader for the old format "
                       "(learner/checkpoint.py) before releasing; `agentrl troubleshoot cannot-resume-after-preemption`")


def repeat_check(rec, cfg) -> Check:
    name = "same tasks, same seed: same reward"
    repeats = rec.extra.get("repeats")
    if not repeats:
        return Check.skipped(name, "only verify's own run repeats tasks; this run recorded none")
    worst = max(repeats, key=lambda r: statistics.pvariance(r["rewards"]))
    var = statistics.pvariance(worst["rewards"])
    return Check.judge(name, var <= cfg.verify.max_reward_variance,
                       {"tasks": len(repeats), "worst_task": worst["task_id"], "rewards": worst["rewards"], "variance": round(var, 6)},
                       f"variance <= {cfg.verify.max_reward_variance:g}",
                       "the environment or the reward is not deterministic: check reset (stage 5) and the reward (stage 6); "
                       "`agentrl troubleshoot reward-variance-high`")


def canary_live_check(cfg) -> Check:
    """Score the answers a cheating agent would try on every canary through the configured reward."""
    from agentrl_cli.runtime.reward.client import reward_client
    from agentrl_cli.runtime.reward.models import ScoreRequest
    from agentrl_cli.acceptance.verify.connectivity import Deadline, within
    from harnesses.canaries import attempts, canary_tasks, original_of

    name = "canaries score 0: answers a cheating agent tries (scored now)"
    reqs = []
    for h in cfg.harnesses:
        for task in canary_tasks(h.name):
            tries = attempts(task, original_of(task))
            if task.meta.get("verify") == "tests":  # hidden tests need a sandbox each: only the attempts with code
                tries = [a for a in tries if a["files"]]
            for i, a in enumerate(tries):
                reqs.append(ScoreRequest.model_validate({
                    "task": {"task_id": task.task_id, "harness": task.harness, "prompt": task.prompt, "answer": task.answer,
                             "difficulty": task.difficulty, "split": task.split, "meta": task.meta},
                    "trajectory_id": f"canary-{task.task_id.replace('/', '-')}-{i}",
                    "steps": [{"action": a["final_answer"] or "(files)"}], **a}))
    if not reqs:
        return Check.skipped(name, "no configured harness has canaries")
    client = reward_client(cfg)
    try:
        results = within(90.0, lambda: client.score_batch(reqs))
    except Deadline as exc:
        return Check.skipped(name, f"the reward did not answer: {exc} (see the connectivity layer)")
    finally:
        client.close()
    scored = [(q, r) for q, r in zip(reqs, results) if r.status != RewardStatus.INFRA_ERROR]
    if not scored:
        return Check.skipped(name, "the reward could not score any canary (see the connectivity layer)")
    positive = [{"task": q.task.task_id, "answer": q.final_answer, "reward": round(r.reward, 4),
                 "outcome_score": r.components.get("outcome")} for q, r in scored
                if (r.components.get("outcome") or 0) > 0 or r.outcome in (Outcome.SUCCESS, Outcome.PARTIAL)]
    return Check.judge(name, not positive, {"scored": len(scored), "positive": len(positive), "first": positive[:3]},
                       "outcome score 0 on every canary attempt (format and tool-legality components aside)",
                       "the reward pays for answers that cannot be right: a default high score, a verifier that "
                       "accepts anything, or the answer leaking; `agentrl troubleshoot canary-rewarded`")


def canary_policy_check(rec) -> Check:
    name = "canaries score 0: the policy's own attempts"
    canaries = rec.extra.get("canaries")
    rates = {k: v for k, v in rec.eval_rates().items() if k.startswith("canary")}
    if not canaries and not rates:
        return Check.skipped(name, "only verify's own run evaluates canaries; this run recorded none")
    positive = [c for c in (canaries or []) if (c.get("outcome_score") or 0) > 0 or c.get("outcome") in (Outcome.SUCCESS, Outcome.PARTIAL)]
    positive += [{"task": k, "success_rate": v[-1][1]} for k, v in rates.items() if any(rate > 0 for _, rate in v)]
    return Check.judge(name, not positive, {"evaluated": len(canaries or []) + len(rates), "positive": positive[:5]},
                       "outcome score 0 on every canary",
                       "the policy got paid for a task with no right answer: look at its trajectory "
                       "(`agentrl data query 'task_id=…'`) and at the verifier; `agentrl troubleshoot canary-rewarded`")


def checks(ctx) -> list[Check]:
    rec, cfg = ctx.record, ctx.config
    out = [loss_check(rec)]
    out += reward_distribution_checks(rec, cfg, ctx.trajectories())
    out += checkpoint_checks(rec)
    out += [repeat_check(rec, cfg), canary_live_check(cfg), canary_policy_check(rec)]
    return out
