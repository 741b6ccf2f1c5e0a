"""GRPO maths in plain torch: group-relative advantages, batching of token sequences, per-token
log-probs and entropy from a causal LM, the token-level PPO-clip loss and the trainer/inference
log-prob mismatch.

What belongs here: functions of tensors and samples with no knowledge of DeepSpeed, processes or
files. What does not: optimizer steps, distributed setup, checkpoints (see `deepspeed_backend.py`).

Conventions: position t of every per-token tensor is about token t given tokens < t. Position 0
has no prediction, so it is never in the loss mask (`collate` clears it).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

Tokens = Sequence[int] | np.ndarray
Floats = Sequence[float] | np.ndarray


def group_advantages(rewards: list[float | None], groups: list[str], eps: float = 1e-6,
                     scale: bool = True) -> list[float]:
    """GRPO advantages: each reward minus its group's mean, divided by the group's std + eps when
    `scale` (the sample std, ddof=1, as TRL and verl use).

    A None reward (an `infra_error`, masked out of training) gets 0.0 and is left out of its group's
    mean and std. A group whose rewards are all equal (or that has one valid reward) gives 0.0:
    it carries no learning signal.
    """
    if len(rewards) != len(groups):
        raise ValueError(f"group_advantages: {len(rewards)} rewards but {len(groups)} group ids; pass one group id per reward")
    by_group: dict[str, list[float]] = defaultdict(list)
    for reward, group in zip(rewards, groups):
        if reward is None:
            continue
        if not math.isfinite(reward):
            raise ValueError(f"group_advantages: reward {reward!r} in group {group!r} is not finite; "
                             "mark a failed rollout with None instead")
        by_group[group].append(float(reward))
    stats: dict[str, tuple[float, float] | None] = {}
    for group, values in by_group.items():
        if len(values) < 2 or max(values) == min(values):
            stats[group] = None
            continue
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
        stats[group] = (mean, std)
    out: list[float] = []
    for reward, group in zip(rewards, groups):
        st = stats.get(group)
        if reward is None or st is None:
            out.append(0.0)
        else:
            mean, std = st
            out.append((reward - mean) / (std + eps) if scale else reward - mean)
    return out


@dataclass
class Sample:
    """One training sequence: the whole episode's tokens (prompt, model turns, tool output).

    loss_mask is 1 on tokens the model generated itself, 0 on prompt, tool and environment tokens.
    logprobs[i] is the behaviour policy's log p(token i | tokens < i) as the inference server
    returned it; only positions with loss_mask 1 are read. advantage: one float for the whole
    sequence (`training.advantage: episode`), or one per token, as long as token_ids
    (`training.advantage: turn`: each turn's tokens their turn's advantage). staleness: trainer versions between the
    weights that sampled it and the weights it trains (None: unknown); only diagnostics read it.
    """

    token_ids: Tokens
    loss_mask: Tokens
    logprobs: Floats
    advantage: float | Floats
    ref_logprobs: Floats | None = None
    staleness: float | None = None


@dataclass
class TrainBatch:
    """Right-padded tensors for a list of samples. Padding has attention_mask 0 and loss_mask 0."""

    input_ids: torch.Tensor          # [B, T] long
    attention_mask: torch.Tensor     # [B, T] long
    loss_mask: torch.Tensor          # [B, T] float
    old_logprobs: torch.Tensor       # [B, T] float
    advantages: torch.Tensor         # [B] float; [B, T] when some sample has per-token advantages
    ref_logprobs: torch.Tensor | None = field(default=None)  # [B, T] float

    @property
    def num_tokens(self) -> int:
        """Tokens in the loss (loss_mask ones)."""
        return int(self.loss_mask.sum().item())

    def to(self, device) -> "TrainBatch":
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return TrainBatch(move(self.input_ids), move(self.attention_mask), move(self.loss_mask),
                          move(self.old_logprobs), move(self.advantages), move(self.ref_logprobs))


def collate(samples: list[Sample], pad_id: int, max_len: int | None = None) -> TrainBatch:
    """Right-pad samples into a TrainBatch; sequences longer than `max_len` lose their tail (the
    mask and log-probs are cut alike). Position 0 is taken out of the loss mask. `advantages` is
    [B] when every sample's advantage is a float (as it always was), [B, T] when one has per-token
    advantages (a float sample's row repeats its value; padding holds 0)."""
    if not samples:
        raise ValueError("collate: no samples")
    arrays = []
    for i, s in enumerate(samples):
        ids, mask, lps = (np.asarray(s.token_ids), np.asarray(s.loss_mask), np.asarray(s.logprobs))
        ref = None if s.ref_logprobs is None else np.asarray(s.ref_logprobs)
        lengths = {len(ids), len(mask), len(lps)} | ({len(ref)} if ref is not None else set())
        if len(lengths) != 1:
            raise ValueError(f"collate: sample {i} has token_ids/loss_mask/logprobs(/ref_logprobs) of lengths "
                             f"{len(ids)}/{len(mask)}/{len(lps)}{'' if ref is None else '/' + str(len(ref))}; they must match")
        if len(ids) == 0:
            raise ValueError(f"collate: sample {i} has no tokens")
        arrays.append((ids, mask, lps, ref))
    with_ref = [a[3] is not None for a in arrays]
    if any(with_ref) and not all(with_ref):
        raise ValueError("collate: some samples have ref_logprobs and some do not; give all or none")
    T = max(len(a[0]) for a in arrays)
    if max_len is not None:
        T = min(T, max_len)
    B = len(samples)
    input_ids = torch.full((B, T), pad_id, dtype=torch.long)
    attention = torch.zeros((B, T), dtype=torch.long)
    loss_mask = torch.zeros((B, T), dtype=torch.float32)
    old = torch.zeros((B, T), dtype=torch.float32)
    ref_t = torch.zeros((B, T), dtype=torch.float32) if all(with_ref) else None
    for b, (ids, mask, lps, ref) in enumerate(arrays):
        n = min(len(ids), T)
        input_ids[b, :n] = torch.as_tensor(ids[:n].astype(np.int64))
        attention[b, :n] = 1
        loss_mask[b, :n] = torch.as_tensor(mask[:n].astype(np.float32))
        old[b, :n] = torch.as_tensor(lps[:n].astype(np.float32))
        if ref_t is not None:
            ref_t[b, :n] = torch.as_tensor(ref[:n].astype(np.float32))
    loss_mask[:, 0] = 0.0
    old = torch.where(loss_mask > 0, old, 0.0)  # never read outside the mask; keep it finite there
    if ref_t is not None:
        ref_t = torch.where(loss_mask > 0, ref_t, 0.0)
    return TrainBatch(input_ids, attention, loss_mask, old, _advantages(samples, T), ref_t)


def _advantages(samples: list[Sample], T: int) -> torch.Tensor:
    """[B] of the samples' float advantages, or [B, T] when one of them is per-token."""
    if all(np.ndim(s.advantage) == 0 for s in samples):
        return torch.tensor([float(s.advantage) for s in samples], dtype=torch.float32)
    out = torch.zeros((len(samples), T), dtype=torch.float32)
    for b, s in enumerate(samples):
        adv = np.asarray(s.advantage, dtype=np.float32)
        if adv.ndim == 0:
            out[b, :min(len(s.token_ids), T)] = float(adv)
            continue
        if len(adv) != len(s.token_ids):
            raise ValueError(f"collate: sample {b} has {len(adv)} per-token advantages for {len(s.token_ids)} tokens; they must match")
        n = min(len(adv), T)
        out[b, :n] = torch.as_tensor(adv[:n])
    return out


def token_logprobs(model, batch: TrainBatch, temperature: float = 1.0,
                   only_masked: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprobs, entropy), both [B, T] float32: position t holds log p(token t | tokens < t) and the
    entropy of that predictive distribution; position 0 holds 0. Logits are divided by
    `temperature` (match the sampling temperature so the ratio compares like with like).

    `only_masked`: compute the vocabulary projection, softmax and entropy only at the positions
    where some row has a loss-mask token (the model's own tokens; prompt and tool tokens are never
    in the loss), and leave 0 elsewhere. The values at those positions are the same; on an agent's
    trajectories, mostly prompt and tool output, this is most of a train step's work saved. Needs a
    model whose forward takes `logits_to_keep` (Hugging Face causal LMs); others compute them all."""
    keep = _kept_positions(model, batch) if only_masked else None
    if keep is None:
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).logits
        logp = F.log_softmax(logits[:, :-1].float() / temperature, dim=-1)
        chosen = logp.gather(-1, batch.input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        entropy = -(logp.exp() * logp).sum(-1)
        zero = chosen.new_zeros(chosen.shape[0], 1)
        return torch.cat([zero, chosen], dim=1), torch.cat([zero, entropy], dim=1)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False,
                   logits_to_keep=keep).logits  # [B, K, V]: predictions at positions `keep`
    logp = F.log_softmax(logits.float() / temperature, dim=-1)
    targets = batch.input_ids[:, keep + 1]
    B, T = batch.input_ids.shape
    lp_all = logp.new_zeros(B, T)
    ent_all = logp.new_zeros(B, T)
    lp_all[:, keep + 1] = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    ent_all[:, keep + 1] = -(logp.exp() * logp).sum(-1)
    return lp_all, ent_all


def _kept_positions(model, batch: TrainBatch) -> torch.Tensor | None:
    """Prediction positions t (token t + 1 is in some row's loss mask), or None when the model's
    forward cannot keep a subset of its logits."""
    import inspect

    target = getattr(model, "module", model)  # a DeepSpeed engine passes keyword arguments through
    try:
        if "logits_to_keep" not in inspect.signature(target.forward).parameters:
            return None
    except (TypeError, ValueError):
        return None
    keep = torch.nonzero(batch.loss_mask[:, 1:].sum(0) > 0).flatten().to(batch.input_ids.device)
    return keep if len(keep) else None


def _masked_mean(values: torch.Tensor, mask: torch.Tensor, denom: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / denom


def ppo_clip_loss(new_lp: torch.Tensor, old_lp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                  clip_eps: float, kl_coef: float = 0.0, ref_lp: torch.Tensor | None = None,
                  entropy: torch.Tensor | None = None, entropy_coef: float = 0.0,
                  num_tokens: float | None = None,
                  token_weights: torch.Tensor | None = None, *, clip_eps_high: float | None = None,
                  sequence_ratio: bool = False,
                  behaviour_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-level PPO-clip loss with ratio exp(new_lp - old_lp) and one advantage per sequence
    (`advantages` [B]) or per token ([B, T], `training.advantage: turn`).

    The loss is averaged over all masked tokens of the batch (every token weighs the same, however
    long its sequence), or divided by `num_tokens` when given: a train step spread over several
    micro-batches passes its total masked-token count so the summed micro-batch losses equal the
    token mean over the whole step. Adds `kl_coef` * k3 KL to `ref_lp` when a reference is given,
    and subtracts `entropy_coef` * mean entropy when `entropy` is given.

    `token_weights` ([B, T], zero outside the mask) replaces that token mean by a weighted sum, e.g.
    `sequence_weights` for a mean over sequences of their token means.

    Off-policy options (`corrections.py` chooses them): the ratio is clamped to [1 - clip_eps,
    1 + `clip_eps_high`] (None: clip_eps); `sequence_ratio` gives every token its sequence's ratio
    exp(mean over the sequence's masked tokens of new_lp - old_lp) (GSPO); `behaviour_weights`
    ([B, T], detached) multiplies each token's clipped term (importance weights).

    Metrics (means over this batch's masked tokens, as floats): `clip_fraction` (the ratio outside
    the clip range), `approx_kl` (k3 estimate of KL(old || new), per token), `entropy`, and `kl_ref`
    with a reference.
    """
    mask = mask.to(new_lp.dtype)
    n_here = mask.sum().clamp(min=1.0)
    denom = n_here if num_tokens is None else torch.as_tensor(max(float(num_tokens), 1.0), dtype=new_lp.dtype)
    inside = mask > 0
    log_ratio = torch.where(inside, new_lp - old_lp, 0.0)  # unread positions: no inf/nan leaks in
    token_ratio = torch.exp(log_ratio)
    ratio = torch.exp(_sequence_mean(log_ratio, mask, inside)) if sequence_ratio else token_ratio
    high = clip_eps if clip_eps_high is None else clip_eps_high
    adv = advantages.to(new_lp.dtype)
    adv = adv.unsqueeze(-1) if adv.dim() == 1 else adv
    per_token = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1.0 - clip_eps, 1.0 + high))
    if behaviour_weights is not None:
        per_token = per_token * behaviour_weights.detach().to(per_token.dtype)
    if token_weights is not None:
        mask, denom = token_weights.to(new_lp.dtype), torch.ones((), dtype=new_lp.dtype)
    loss = _masked_mean(per_token, mask, denom)
    metrics: dict[str, float] = {}
    on = inside.to(new_lp.dtype)
    with torch.no_grad():
        clipped = ((ratio - 1.0) > high) | ((1.0 - ratio) > clip_eps)
        metrics["clip_fraction"] = _masked_mean(clipped.to(on.dtype), on, n_here).item()
        metrics["approx_kl"] = _masked_mean((token_ratio - 1.0) - log_ratio, on, n_here).item()
    if ref_lp is not None:
        d = torch.where(inside, ref_lp - new_lp, 0.0)
        k3 = torch.exp(d) - d - 1.0
        if kl_coef:
            loss = loss + kl_coef * _masked_mean(k3, mask, denom)
        metrics["kl_ref"] = _masked_mean(k3.detach(), on, n_here).item()
    if entropy is not None:
        if entropy_coef:
            loss = loss - entropy_coef * _masked_mean(entropy, mask, denom)
        metrics["entropy"] = _masked_mean(entropy.detach(), on, n_here).item()
    return loss, metrics


def _sequence_mean(log_ratio: torch.Tensor, mask: torch.Tensor, inside: torch.Tensor) -> torch.Tensor:
    """Each row's mean of `log_ratio` over its masked tokens, on those tokens (0 elsewhere)."""
    per_row = (log_ratio * mask).sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1.0)
    return torch.where(inside, per_row, 0.0)


def sequence_weights(loss_mask: torch.Tensor, num_sequences: int) -> torch.Tensor:
    """Token weights for a mean over sequences of each sequence's token mean (every trajectory
    counts the same, however long): mask / (tokens in its row) / num_sequences."""
    per_row = loss_mask.sum(dim=1, keepdim=True).clamp(min=1.0)
    return loss_mask / per_row / max(int(num_sequences), 1)


LOSS_AGGREGATIONS = ("token_mean", "seq_mean_token_sum", "seq_mean")


def aggregation_weights(mode: str, loss_mask: torch.Tensor, num_sequences: int) -> torch.Tensor | None:
    """`ppo_clip_loss`'s `token_weights` for `training.loss_aggregation` (l_it: token t's loss in
    sequence i, M_i its trained tokens, N the step's sequences with any):
    token_mean: sum_i sum_t l_it / sum_i M_i (None: the loss's own token mean, over `num_tokens`);
    seq_mean_token_sum: (1/N) sum_i sum_t l_it (DAPO's and verl's name; a longer answer weighs more);
    seq_mean: (1/N) sum_i (1/M_i) sum_t l_it (every trajectory weighs the same; `sequence_weights`)."""
    if mode == "token_mean":
        return None
    if mode == "seq_mean_token_sum":
        return loss_mask.to(torch.float32) / max(int(num_sequences), 1)
    if mode == "seq_mean":
        return sequence_weights(loss_mask, num_sequences)
    raise ValueError(f"loss_aggregation {mode!r} is not one of {', '.join(LOSS_AGGREGATIONS)}; set training.loss_aggregation to one of them")


def mismatch_kl(infer_lp: torch.Tensor, train_lp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """k3 estimate of KL(inference || trainer) over masked tokens, from the log-probs the inference
    server returned and the trainer's own log-probs of the same tokens before any update. Zero
    when both agree; large values mean the two disagree (precision, kernels, stale weights)."""
    mask = mask.to(torch.float32)
    d = torch.where(mask > 0, train_lp.detach().float() - infer_lp.float(), 0.0)
    k3 = torch.exp(d) - d - 1.0
    return (k3 * mask).sum() / mask.sum().clamp(min=1.0)
