"""Verify layer 4, small-sample convergence: the policy improves with 95% confidence (a fit, not a
two-point difference), entropy neither collapsed nor exploding, gradient norm stable, and
`mismatch_kl` (sampler vs trainer log-probs) small.

Improvement is judged on the greedy evaluation of the training harnesses when the run evaluated
them with episode counts (a line through every evaluated episode against its step): a curriculum
that keeps drawing tasks the policy solves about half the time holds the per-step training reward
flat by design, so that reward's slope says little. Without such evaluations, the per-step reward
is fitted instead.
"""

from __future__ import annotations

import statistics

from agentrl_cli.runtime.observe import keys
from agentrl_cli.core.report import Check
from agentrl_cli.acceptance.verify.judge import entropy_trend, eval_rises, grad_norm_stable, reward_rises

MISMATCH_KL_MAX = 0.05  # median KL between the server's and the trainer's log-probs of the same tokens


def learning_progress(rec, training_harnesses: list[str]) -> tuple[bool, str, dict, str]:
    """(ok, check name, measured, target): the evaluation curve of the training harnesses when the
    run recorded one with episode counts (at least two evaluations), else the per-step reward."""
    curve = rec.eval_curve(training_harnesses)
    if len(curve) >= 2:
        ok, measured = eval_rises(curve)
        return (ok, "evaluation success rises (95% lower bound > 0)", {"harnesses": training_harnesses, **measured},
                "lower bound of the slope of greedy success per evaluated episode > 0")
    ok, measured = reward_rises(rec.column(keys.REWARD_MEAN))
    return ok, "reward slope positive (95% lower bound > 0)", measured, "lower bound of the slope per step > 0"


def checks(ctx) -> list[Check]:
    rec = ctx.record
    if not rec.has_training:
        return [Check.skipped("convergence", "the run has too few trainer steps to judge")]
    ok, name, measured, target = learning_progress(rec, [h.name for h in ctx.config.harnesses if not h.held_out])
    out = [Check.judge(name, ok, measured, target,
                       "the policy does not improve: check training.learning_rate (not ~0), the reward sign and staleness; "
                       "`agentrl troubleshoot training-not-converging`")]
    ok, measured = entropy_trend(rec.column(keys.TRAIN_ENTROPY))
    out.append(Check.judge("entropy neither collapses nor explodes", ok, measured,
                           "median of the last steps within 0.1x-10x of the first steps'",
                           "lower training.learning_rate or add training.entropy_coef; `agentrl troubleshoot entropy-collapse-or-explosion`"))
    ok, measured = grad_norm_stable(rec.column(keys.TRAIN_GRAD_NORM))
    out.append(Check.judge("gradient norm stable", ok, measured, "finite, max <= 100x median",
                           "lower training.learning_rate or training.max_grad_norm; `agentrl troubleshoot grad-norm-unstable`"))
    kl = rec.column(keys.TRAIN_MISMATCH_KL)
    if kl:
        med = statistics.median(kl)
        out.append(Check.judge("mismatch_kl small (sampler vs trainer log-probs)", med <= MISMATCH_KL_MAX,
                               {"median": round(med, 6), "max": round(max(kl), 6)}, f"median <= {MISMATCH_KL_MAX:g}",
                               "the server samples from other weights than the trainer's: check weight sync and staleness; "
                               "`agentrl troubleshoot bad-after-weight-sync`"))
    else:
        out.append(Check.skipped("mismatch_kl small (sampler vs trainer log-probs)", "the run recorded no mismatch_kl"))
    return out
