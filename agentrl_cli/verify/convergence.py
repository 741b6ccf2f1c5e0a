"""Verify layer 4, small-sample convergence, from the trainer-step rows of the run: the reward's
slope positive with 95% confidence (a fit over every step, not a two-point difference), entropy
neither collapsed nor exploding, gradient norm stable, and `mismatch_kl` (sampler vs trainer
log-probs) small.
"""

from __future__ import annotations

import statistics

from agentrl_cli.report import Check
from agentrl_cli.verify.judge import entropy_trend, grad_norm_stable, reward_rises

MISMATCH_KL_MAX = 0.05  # median KL between the server's and the trainer's log-probs of the same tokens


def checks(ctx) -> list[Check]:
    rec = ctx.record
    if not rec.has_training:
        return [Check.skipped("convergence", "the run has too few trainer steps to judge")]
    rewards = rec.column("reward/mean")
    ok, measured = reward_rises(rewards)
    out = [Check.judge("reward slope positive (95% lower bound > 0)", ok, measured, "lower bound of the slope per step > 0",
                       "reward does not rise: check training.learning_rate (not ~0), the reward sign and staleness; "
                       "`agentrl troubleshoot training-not-converging`")]
    ok, measured = entropy_trend(rec.column("train/entropy"))
    out.append(Check.judge("entropy neither collapses nor explodes", ok, measured,
                           "median of the last steps within 0.1x-10x of the first steps'",
                           "lower training.learning_rate or add training.entropy_coef; `agentrl troubleshoot entropy-collapse-or-explosion`"))
    ok, measured = grad_norm_stable(rec.column("train/grad_norm"))
    out.append(Check.judge("gradient norm stable", ok, measured, "finite, max <= 100x median",
                           "lower training.learning_rate or training.max_grad_norm; `agentrl troubleshoot grad-norm-unstable`"))
    kl = rec.column("train/mismatch_kl")
    if kl:
        med = statistics.median(kl)
        out.append(Check.judge("mismatch_kl small (sampler vs trainer log-probs)", med <= MISMATCH_KL_MAX,
                               {"median": round(med, 6), "max": round(max(kl), 6)}, f"median <= {MISMATCH_KL_MAX:g}",
                               "the server samples from other weights than the trainer's: check weight sync and staleness; "
                               "`agentrl troubleshoot bad-after-weight-sync`"))
    else:
        out.append(Check.skipped("mismatch_kl small (sampler vs trainer log-probs)", "the run recorded no mismatch_kl"))
    return out
