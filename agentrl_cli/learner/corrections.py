"""Off-policy correction of the GRPO learner, in plain torch: the behaviour importance weights that
correct for samples drawn by another policy than the one being trained (an older one under
asynchronous rollout, or the same weights computed by other kernels on the inference server), the
loss that applies them, and the step's diagnostics of those weights.

Three policies meet in a train step. pi_rollout: the log-probs the inference server reported for
the tokens it sampled (`Sample.logprobs`). pi_old: the trainer's own log-probs of the same tokens
under the weights at the start of the step, computed with no gradient (the backend's extra forward).
pi_theta: the log-probs being trained. `training.correction` picks the objective:

- `none`: the ratio pi_theta/pi_rollout, clipped (PPO against the inference log-probs; no pi_old is
  computed). Unchanged from before corrections existed.
- every other mode is the decoupled objective of AReaL (Fu et al. 2025): the clipped ratio is
  pi_theta/pi_old (the trust region is around the weights being updated) and each token's clipped
  term is multiplied by a detached behaviour weight built from rho = pi_old/pi_rollout:
  - `tis`: truncated importance sampling per token, w = min(rho, C) (verl's TIS, C = `is_cap`);
  - `seq_tis`: per sequence, w = min(exp(sum over its trained tokens of log rho), C), on every token;
  - `mis`: masked importance sampling per token, w = rho when `mis_low` <= rho <= `mis_high`, else 0:
    the token is dropped from the loss (rejection);
  - `seq_mis`: the same with the sequence's rho = exp(sum of log rho): a whole sequence is kept or dropped;
  - `decoupled`: AReaL's own behaviour weight, w = rho untruncated, and a token whose rho exceeds C is
    dropped (AReaL's `behav_imp_weight_cap` filters such tokens out rather than truncating them).
  A dropped token still counts in the token mean's denominator (its term is zero), as in AReaL, so the
  loss scale does not follow the rejection rate.
- asymmetric clipping: the ratio is clamped to [1 - `clip_ratio_low`, 1 + `clip_ratio_high`] (DAPO's
  clip-higher); both default to `clip_eps`.
- `ratio_level: sequence` (GSPO, Zheng et al. 2025): every token of a sequence takes the sequence's
  ratio exp(mean over its trained tokens of log pi_theta - log pi_base); with `loss_aggregation:
  seq_mean` this is GSPO's sequence-mean objective, with `token_mean` each sequence weighs by its
  length, as AReaL computes it.

Diagnostics (`diagnostics`), over the step's units (tokens; sequences for `seq_*` modes) with a
trained token: the mean, max and p99 (nearest rank) of rho as measured (before truncation or
rejection: how far the behaviour policy is), the effective sample size of the weights applied,
(sum w)^2 / sum w^2 / n (1 when every unit weighs the same, 1/n when one unit carries the step), and
the fraction rejected. Policy lag per token (`policy_lag`) is the token-weighted mean of the samples'
`Sample.staleness` (trainer versions between the weights that sampled them and the weights they train),
reported only when every trained sample carries one.

What belongs here: functions of tensors with no knowledge of DeepSpeed, processes or files. What
does not: the pi_old forward and the gathering of diagnostics over ranks (`deepspeed_backend.py`),
the PPO-clip term itself (`grpo.ppo_clip_loss`, which takes the weights), the metric names
(`runtime/observe/keys.py`).

Conventions: per-token tensors are [B, T] as in `grpo.py`; position 0 is never in the loss mask.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from agentrl_cli.runtime.observe import keys
from agentrl_cli.learner.grpo import ppo_clip_loss

MODES = ("none", "tis", "seq_tis", "mis", "seq_mis", "decoupled")
SEQUENCE_MODES = ("seq_tis", "seq_mis")
LOG_RATIO_LIMIT = 80.0  # |log rho| is clamped here so a long sequence's product ratio stays finite in float32

WEIGHT_MEAN = keys.train_name(keys.TRAIN_IS_WEIGHT_MEAN)
WEIGHT_MAX = keys.train_name(keys.TRAIN_IS_WEIGHT_MAX)
WEIGHT_P99 = keys.train_name(keys.TRAIN_IS_WEIGHT_P99)
ESS = keys.train_name(keys.TRAIN_IS_ESS)
REJECTED_FRACTION = keys.train_name(keys.TRAIN_IS_REJECTED_FRACTION)
POLICY_LAG = keys.train_name(keys.TRAIN_POLICY_LAG)


@dataclass(frozen=True)
class Correction:
    """The learner's objective: see the module docstring for each mode."""

    mode: str = "none"
    is_cap: float = 2.0
    mis_low: float = 0.5
    mis_high: float = 2.0
    clip_low: float = 0.2
    clip_high: float = 0.2
    ratio_level: str = "token"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown correction {self.mode!r}; known: {', '.join(MODES)}")
        if self.ratio_level not in ("token", "sequence"):
            raise ValueError(f"ratio_level must be token or sequence, got {self.ratio_level!r}")

    @classmethod
    def from_config(cls, cfg) -> "Correction":
        """From a `TrainingConfig`: unset clip_ratio_low / clip_ratio_high take clip_eps."""
        low = cfg.clip_ratio_low if cfg.clip_ratio_low is not None else cfg.clip_eps
        high = cfg.clip_ratio_high if cfg.clip_ratio_high is not None else cfg.clip_eps
        return cls(cfg.correction, cfg.is_cap, cfg.mis_low, cfg.mis_high, low, high, cfg.ratio_level)

    @property
    def needs_old_logprobs(self) -> bool:
        """Whether the step needs pi_old (every mode but `none`)."""
        return self.mode != "none"


@dataclass
class BehaviourWeights:
    """The weights of one micro-batch: `weights` [B, T] multiplies each token's clipped term (zero
    outside the mask and on dropped tokens); `raw`, `applied`, `rejected` are per unit (token, or
    sequence in `seq_*` modes, with a trained token), flat, for the diagnostics."""

    weights: torch.Tensor
    raw: torch.Tensor
    applied: torch.Tensor
    rejected: torch.Tensor


def behaviour_weights(old_lp: torch.Tensor, rollout_lp: torch.Tensor, mask: torch.Tensor,
                      correction: Correction) -> BehaviourWeights:
    """The detached behaviour weights of `correction.mode` (not `none`) from pi_old and pi_rollout."""
    if correction.mode == "none":
        raise ValueError("behaviour_weights: correction none applies no behaviour weight")
    inside = mask > 0
    log_rho = torch.where(inside, old_lp.detach().float() - rollout_lp.float(), 0.0)
    if correction.mode in SEQUENCE_MODES:
        rows = inside.any(dim=1)
        log_unit = log_rho.sum(dim=1).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)  # [B]
        raw, applied, rejected = _unit_weights(log_unit, correction)
        per_row = torch.where(rows, applied, 0.0)
        weights = per_row.unsqueeze(1) * inside.to(per_row.dtype)
        return BehaviourWeights(weights, raw[rows], applied[rows], rejected[rows])
    log_unit = log_rho.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    raw, applied, rejected = _unit_weights(log_unit, correction)
    weights = torch.where(inside, applied, 0.0)
    return BehaviourWeights(weights, raw[inside], applied[inside], rejected[inside])


def _unit_weights(log_rho: torch.Tensor, c: Correction) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rho, the weight applied, dropped) of each unit from its log rho."""
    rho = torch.exp(log_rho)
    if c.mode in ("tis", "seq_tis"):
        return rho, torch.clamp(rho, max=c.is_cap), torch.zeros_like(rho, dtype=torch.bool)
    if c.mode in ("mis", "seq_mis"):
        dropped = (rho < c.mis_low) | (rho > c.mis_high)
    else:  # decoupled
        dropped = rho > c.is_cap
    return rho, torch.where(dropped, 0.0, rho), dropped


def policy_loss(new_lp: torch.Tensor, old_lp: torch.Tensor | None, rollout_lp: torch.Tensor, advantages: torch.Tensor,
                mask: torch.Tensor, correction: Correction, weights: torch.Tensor | None = None,
                **ppo_kwargs) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped policy loss of `correction` (and `grpo.ppo_clip_loss`'s metrics). `none` clips
    pi_theta/pi_rollout and ignores `old_lp`; the other modes clip pi_theta/pi_old and multiply by
    `weights` (the micro-batch's `behaviour_weights(...).weights`; computed here when not given).
    `ppo_kwargs` go to `ppo_clip_loss` (kl_coef, ref_lp, entropy, entropy_coef, num_tokens, token_weights)."""
    sequence = correction.ratio_level == "sequence"
    if not correction.needs_old_logprobs:
        base, weights = rollout_lp, None
    else:
        if old_lp is None:
            raise ValueError(f"policy_loss: correction {correction.mode} needs pi_old (old_lp); compute it with no "
                             "gradient under the step's starting weights")
        base = old_lp.detach()
        if weights is None:
            weights = behaviour_weights(old_lp, rollout_lp, mask, correction).weights
    return ppo_clip_loss(new_lp, base, advantages, mask, correction.clip_low, clip_eps_high=correction.clip_high,
                         sequence_ratio=sequence, behaviour_weights=weights, **ppo_kwargs)


def diagnostics(raw: torch.Tensor, applied: torch.Tensor, rejected: torch.Tensor) -> dict[str, float]:
    """The step's weight diagnostics over its units (flat tensors, one entry per unit): mean, max and
    nearest-rank p99 of rho, effective sample size of the applied weights over n, fraction rejected.
    No units (no trained token): an empty dict."""
    n = int(raw.numel())
    if n == 0:
        return {}
    raw, applied = raw.double(), applied.double()
    k = (99 * n + 99) // 100  # nearest rank: the ceil(0.99 n)-th smallest
    square = float((applied * applied).sum())
    ess = float(applied.sum()) ** 2 / square / n if square > 0 else 0.0
    return {WEIGHT_MEAN: float(raw.mean()), WEIGHT_MAX: float(raw.max()),
            WEIGHT_P99: float(torch.kthvalue(raw, k).values), ESS: ess,
            REJECTED_FRACTION: float(rejected.double().mean())}


def policy_lag(staleness: Sequence[float | None], tokens: torch.Tensor) -> float | None:
    """Token-weighted mean of each sample's staleness over the samples with trained tokens (`tokens`:
    trained tokens per sample); None when one of them carries no staleness or none has a token."""
    counts = [float(t) for t in tokens.flatten().tolist()]
    if len(counts) != len(staleness):
        raise ValueError(f"policy_lag: {len(staleness)} staleness values for {len(counts)} samples")
    pairs = [(s, t) for s, t in zip(staleness, counts) if t > 0]
    if not pairs or any(s is None for s, _ in pairs):
        return None
    return sum(float(s) * t for s, t in pairs) / sum(t for _, t in pairs)
