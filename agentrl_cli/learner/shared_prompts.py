"""Per-token log-probs of a GRPO micro-batch with every prompt run through the model once.

A GRPO group is one prompt sampled several times, so most of a micro-batch is the same prompt
tokens repeated (8 samples of a 208-token prompt with 28-token answers: 87% of the tokens). A
causal model's states over the prompt do not depend on what follows it, so the prompt can be run
once per distinct prompt with its key/value cache kept, the cache repeated for each sample, and
only the rest of each sample (the model's turns and tool output) run on top of it. The log-probs
and entropies at every position are those of the whole-sequence forward (the same maths, in
another order), and so are the gradients: each prompt's states receive the sum of its samples'
gradients.

The prompt of a sample is everything before its first loss-mask token (the first token the model
generated); samples whose prompts are token-for-token equal share it, whatever their group ids.
`split` returns None when no two samples share a prompt or sharing would not save work, and
`token_logprobs` then computes the whole sequences (`grpo.token_logprobs`). Needs a Hugging Face
causal LM whose forward takes a cache, `position_ids` and `logits_to_keep`; other models take the
whole-sequence path.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from agentrl_cli.learner import grpo
from agentrl_cli.learner.grpo import TrainBatch


@dataclass
class PromptSplit:
    """A micro-batch as distinct prompts and per-sample continuations (both right-padded)."""

    prefix_ids: torch.Tensor   # [G, P] the distinct prompts
    prefix_mask: torch.Tensor  # [G, P]
    last: torch.Tensor         # [G] column of each prompt's last token
    group: torch.Tensor        # [B] prompt row of each sample
    suffix_ids: torch.Tensor   # [B, S] each sample's tokens after its prompt
    suffix_mask: torch.Tensor  # [B, S]
    start: torch.Tensor        # [B] position of each sample's first suffix token in the whole sequence

    def to(self, device) -> "PromptSplit":
        return PromptSplit(*(t.to(device) for t in (self.prefix_ids, self.prefix_mask, self.last, self.group,
                                                    self.suffix_ids, self.suffix_mask, self.start)))


def split(batch: TrainBatch, pad_id: int) -> PromptSplit | None:
    """The batch's distinct prompts and continuations, or None when sharing saves no tokens."""
    ids, lengths = batch.input_ids.cpu(), batch.attention_mask.sum(dim=1).cpu()
    in_loss = batch.loss_mask.cpu() > 0
    B, T = ids.shape
    starts = [int(in_loss[b].nonzero()[0]) if bool(in_loss[b].any()) else int(lengths[b]) - 1 for b in range(B)]
    if min(starts) < 1:
        return None  # a one-token sample has no prompt to share
    rows: dict[bytes, int] = {}
    group = [rows.setdefault(ids[b, :starts[b]].numpy().tobytes(), len(rows)) for b in range(B)]
    G = len(rows)
    P = max(starts)
    S = max(int(lengths[b]) - starts[b] for b in range(B))
    if G == B or G * P + B * S >= B * T:
        return None
    prefix_ids = torch.full((G, P), pad_id, dtype=torch.long)
    prefix_mask = torch.zeros((G, P), dtype=torch.long)
    last = torch.zeros(G, dtype=torch.long)
    suffix_ids = torch.full((B, S), pad_id, dtype=torch.long)
    suffix_mask = torch.zeros((B, S), dtype=torch.long)
    for b in range(B):
        g, p, n = group[b], starts[b], int(lengths[b]) - starts[b]
        prefix_ids[g, :p], prefix_mask[g, :p], last[g] = ids[b, :p], 1, p - 1
        suffix_ids[b, :n], suffix_mask[b, :n] = ids[b, p:p + n], 1
    return PromptSplit(prefix_ids, prefix_mask, last, torch.tensor(group), suffix_ids, suffix_mask, torch.tensor(starts))


@functools.cache
def _cache_argument(forward) -> str | None:
    """The name under which `forward` takes a key/value cache, or None when it cannot do this split."""
    try:
        params = inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return None
    if not {"position_ids", "logits_to_keep"} <= set(params):
        return None
    return "cache" if "cache" in params else "past_key_values" if "past_key_values" in params else None


def cache_argument(model) -> str | None:
    return _cache_argument(type(getattr(model, "module", model)).forward)  # a DeepSpeed engine passes keywords through


def token_logprobs(model, batch: TrainBatch, prompts: PromptSplit | None,
                   temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprobs, entropy) [B, T] as `grpo.token_logprobs(only_masked=True)` gives them: the same
    values wherever the loss mask is 1, zero where no sample of the batch has a loss token. Each
    distinct prompt is computed once when `prompts` is given and the model can take a cache."""
    cache_kw = cache_argument(model) if prompts is not None else None
    if cache_kw is None:
        return grpo.token_logprobs(model, batch, temperature, only_masked=True)
    sp = prompts
    B, T = batch.input_ids.shape
    S = sp.suffix_ids.shape[1]
    keep = torch.unique(sp.last)  # sorted: the prompts' last columns predict each sample's first suffix token
    out = model(input_ids=sp.prefix_ids, attention_mask=sp.prefix_mask, use_cache=True, logits_to_keep=keep)
    cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
    first = out.logits[torch.arange(len(sp.last), device=keep.device), torch.searchsorted(keep, sp.last)]  # [G, V]
    first_logp = F.log_softmax(first.float() / temperature, dim=-1)[sp.group]  # [B, V]
    columns = sp.start.unsqueeze(1) + torch.arange(S, device=sp.start.device)  # [B, S] in the whole sequence
    valid = sp.suffix_mask > 0
    columns = torch.where(valid, columns, 0)
    in_loss = batch.loss_mask.gather(1, columns) * sp.suffix_mask
    first_kept = in_loss[:, 0] > 0  # a sample without loss tokens keeps nothing
    lp_s = first_logp.new_zeros(B, S)
    ent_s = first_logp.new_zeros(B, S)
    lp_s[:, 0] = torch.where(first_kept, first_logp.gather(-1, sp.suffix_ids[:, :1]).squeeze(-1), 0.0)
    ent_s[:, 0] = torch.where(first_kept, -(first_logp.exp() * first_logp).sum(-1), 0.0)
    if S > 1:
        need = torch.nonzero(in_loss[:, 1:].sum(0) > 0).flatten()
        if len(need):
            cache.batch_select_indices(sp.group)
            attention = torch.cat([sp.prefix_mask[sp.group], sp.suffix_mask], dim=1)
            logits = model(input_ids=sp.suffix_ids, attention_mask=attention, position_ids=columns, use_cache=True,
                           logits_to_keep=need, **{cache_kw: cache}).logits  # [B, K, V]: column j predicts j + 1
            logp = F.log_softmax(logits.float() / temperature, dim=-1)
            lp_s[:, need + 1] = logp.gather(-1, sp.suffix_ids[:, need + 1].unsqueeze(-1)).squeeze(-1)
            ent_s[:, need + 1] = -(logp.exp() * logp).sum(-1)
    rows = torch.arange(B, device=columns.device).unsqueeze(1).expand(B, S)
    index = (rows[valid], columns[valid])
    lp_all = lp_s.new_zeros(B, T).index_put(index, lp_s[valid])
    ent_all = ent_s.new_zeros(B, T).index_put(index, ent_s[valid])
    return lp_all, ent_all
