"""Sequence packing (`training.max_tokens_per_micro_batch`): a train step's samples grouped into
micro-batches by a token budget and each micro-batch run through the model as ONE row, the samples
laid end to end with their positions restarting at 0, instead of right-padded to the longest.

Packing changes only the forward. A micro-batch is still `grpo.collate`'s right-padded TrainBatch
of its samples (the loss, the advantages, the corrections and their per-sequence sums read that,
unchanged); `token_logprobs` runs the packed row and scatters each sample's log-probs and entropies
back to the [B, T] layout, where they equal the padded forward's (the same maths, another order).

No attention across samples: the row goes in with `position_ids` that restart at 0 for each sample,
no attention mask and no cache, the packed format transformers reads as one sequence per run of
increasing positions (a block-diagonal causal mask for eager, sdpa and flex attention; the segment
lengths for flash attention). With a 2D attention mask or a cache it would attend across samples,
so `check_isolation` runs a small packed pair once and refuses a model that leaks.

Bins: first-fit decreasing on the token counts (after the `training.seq_len_limit` cut), each bin at
most the budget; a sample longer than the budget gets a micro-batch of its own. With several ranks
every rank runs the same number of micro-batches (ZeRO reduces inside backward): a rank with fewer
bins runs `filler` micro-batches, a two-token forward with no loss token (zero loss, zero gradient).

What belongs here: the bin plan, the packed row and its forward. What does not: the loss
(`grpo.py`, `corrections.py`), the micro-batch loop and the ranks (`deepspeed_backend.py`).
Prompt sharing (`shared_prompts.py`) is not combined with packing: a packed micro-batch runs every
sample's whole sequence.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from agentrl_cli.core.errors import ConfigError
from agentrl_cli.learner.grpo import Sample, TrainBatch

# a leak-free model gives the same logits up to kernel rounding (measured: exactly equal on CPU, fp32 and
# bf16); SmolLM2-135M fed a 2D mask, which leaks, moved them by 28.6 for logits up to 22
ISOLATION_TOLERANCE = 1e-3  # of the largest |logit|


def plan(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Bins of sample indices (first-fit decreasing): each bin's lengths sum to at most `budget`,
    except a sample longer than `budget`, which is alone in its bin. Bins come largest first; the
    indices within a bin ascend."""
    if budget < 1:
        raise ValueError(f"packing.plan: budget {budget} must be at least 1 token")
    order = sorted(range(len(lengths)), key=lambda i: (-int(lengths[i]), i))
    bins: list[list[int]] = []
    room: list[int] = []
    for i in order:
        n = int(lengths[i])
        for b, left in enumerate(room):
            if n <= left:
                bins[b].append(i)
                room[b] -= n
                break
        else:
            bins.append([i])
            room.append(budget - n)
    return [sorted(b) for b in bins]


def fill(bins: list[list[int]], count: int) -> list[list[int]]:
    """`bins` followed by empty bins (filler micro-batches) up to `count`."""
    if count < len(bins):
        raise ValueError(f"packing.fill: {len(bins)} bins already exceed {count}")
    return bins + [[] for _ in range(count - len(bins))]


def filler(sample: Sample) -> Sample:
    """A micro-batch's worth of nothing: the first (up to) two tokens of `sample` with no loss token."""
    n = min(2, len(sample.token_ids))
    ref = None if sample.ref_logprobs is None else [0.0] * n
    return Sample(list(np.asarray(sample.token_ids)[:n]), [0] * n, [0.0] * n, 0.0, ref)


@dataclass
class PackedRow:
    """A TrainBatch's samples end to end in one row, and where its loss tokens sit in both layouts."""

    input_ids: torch.Tensor     # [1, N] the samples' tokens, padding left out
    position_ids: torch.Tensor  # [1, N] 0, 1, ... restarting at each sample
    keep: torch.Tensor          # [K] row positions whose next token is a loss token of the same sample
    rows: torch.Tensor          # [K] that token's row in the TrainBatch
    columns: torch.Tensor       # [K] and its column

    def to(self, device) -> "PackedRow":
        return PackedRow(*(t.to(device) for t in (self.input_ids, self.position_ids, self.keep, self.rows, self.columns)))

    @property
    def num_samples(self) -> int:
        return int((self.position_ids == 0).sum())


def pack(batch: TrainBatch) -> PackedRow:
    """The packed row of `batch` (its attention mask says each row's length)."""
    ids, lengths = batch.input_ids.cpu(), batch.attention_mask.sum(dim=1).cpu().tolist()
    in_loss = batch.loss_mask.cpu() > 0
    pieces, positions, keep, rows, columns = [], [], [], [], []
    offset = 0
    for b, n in enumerate(int(n) for n in lengths):
        pieces.append(ids[b, :n])
        positions.append(torch.arange(n))
        t = torch.nonzero(in_loss[b, 1:n]).flatten() + 1  # columns of this sample's loss tokens
        keep.append(offset + t - 1)
        rows.append(torch.full_like(t, b))
        columns.append(t)
        offset += n
    return PackedRow(torch.cat(pieces).unsqueeze(0), torch.cat(positions).unsqueeze(0),
                     torch.cat(keep), torch.cat(rows), torch.cat(columns))


def token_logprobs(model, batch: TrainBatch, packed: PackedRow,
                   temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprobs, entropy) [B, T] of `batch` from one forward over its packed row: the padded
    forward's values at every loss-mask position, 0 elsewhere (as `shared_prompts.token_logprobs`).
    A micro-batch with no loss token still runs the model (its result is zero with a gradient path,
    so every rank's backward reaches every parameter)."""
    B, T = batch.input_ids.shape
    keep = packed.keep if len(packed.keep) else packed.keep.new_tensor([packed.input_ids.shape[1] - 1])
    kwargs = {"logits_to_keep": keep} if _takes(model, "logits_to_keep") else {}
    logits = model(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False, **kwargs).logits
    if logits.shape[1] != len(keep):  # the model computed every position's logits
        logits = logits[:, keep]
    logp = F.log_softmax(logits[0].float() / temperature, dim=-1)  # [K, V]
    lp_all = logp.new_zeros(B, T)
    ent_all = logp.new_zeros(B, T)
    if not len(packed.keep):
        zero = 0.0 * logp[:, 0].sum()
        return lp_all + zero, ent_all + zero
    targets = packed.input_ids[0, keep + 1]
    index = (packed.rows, packed.columns)
    lp_all = lp_all.index_put(index, logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1))
    ent_all = ent_all.index_put(index, -(logp.exp() * logp).sum(-1))
    return lp_all, ent_all


def _takes(model, name: str) -> bool:
    """Whether `model`'s forward takes keyword `name` (by name or through **kwargs)."""
    target = getattr(model, "module", model)  # a DeepSpeed engine passes keyword arguments through
    try:
        params = inspect.signature(target.forward).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def check_isolation(model, device) -> None:
    """Refuse a model that attends across packed samples: the second sample of a packed pair must get
    the same logits whatever the first one holds. Runs in eval mode with no gradient; every rank
    calls it together (ZeRO-3 gathers the weights for the forward)."""
    target = getattr(model, "module", model)
    if not _takes(model, "position_ids"):
        raise ConfigError(f"training.max_tokens_per_micro_batch: {type(target).__name__}.forward takes no position_ids, "
                          "so packed samples cannot restart their positions",
                          "set training.max_tokens_per_micro_batch: 0 (right-padded micro-batches) for this model")
    vocab = int(getattr(getattr(target, "config", None), "vocab_size", 0) or 32)
    second = [(7 + k) % vocab for k in range(3)]
    outs = []
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for first in ([(1 + k) % vocab for k in range(4)], [(11 + k) % vocab for k in range(4)]):
                ids = torch.tensor([first + second], device=device)
                pos = torch.tensor([list(range(4)) + list(range(3))], device=device)
                outs.append(model(input_ids=ids, position_ids=pos, use_cache=False).logits[0, 4:].float())
    finally:
        model.train(was_training)
    diff = float((outs[0] - outs[1]).abs().max())
    if not diff <= ISOLATION_TOLERANCE * max(1.0, float(outs[0].abs().max())):
        attn = getattr(getattr(target, "config", None), "_attn_implementation", "unknown")
        raise ConfigError(f"training.max_tokens_per_micro_batch: {type(target).__name__} (attention {attn}) attends across "
                          f"packed samples (a sample's logits moved by {diff:.3g} when the sample before it changed)",
                          "set training.max_tokens_per_micro_batch: 0, or load the model with eager, sdpa, flex or flash "
                          "attention, which read packed samples from position_ids")
