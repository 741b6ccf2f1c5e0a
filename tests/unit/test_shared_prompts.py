"""Each distinct prompt computed once (`shared_prompts`): the log-probs, entropies and loss gradients
are those of the whole-sequence computation, for groups with prompts of different lengths,
multi-turn masks, a sample with a prompt of its own and one with no loss tokens."""

from __future__ import annotations

import pytest
import torch

from agentrl_cli.learner import shared_prompts
from agentrl_cli.learner.grpo import Sample, collate, ppo_clip_loss, token_logprobs


@pytest.fixture(scope="module")
def tiny_model():
    from agentrl_cli.model.tiny import init_model

    model, tokenizer = init_model(seed=7, num_hidden_layers=2)
    return model.eval(), tokenizer


def sample(prompt: list[int], rest: list[int], mask: list[int], advantage: float) -> Sample:
    ids = prompt + rest
    return Sample(ids, [0] * len(prompt) + mask, [-1.5] * len(ids), advantage)


A = [11, 12, 13, 14, 15, 16, 17]
B = [21, 22, 23, 24]
SAMPLES = [
    sample(A, [30, 31, 32], [1, 1, 1], 1.0),
    sample(A, [33, 34, 40, 41, 35, 36], [1, 1, 0, 0, 1, 1], -0.5),  # model, tool output, model
    sample(A, [37], [1], 0.3),
    sample(B, [50, 51, 52, 53, 54, 55, 56, 57], [1] * 8, 0.7),
    sample(B, [58, 59], [1, 1], -1.0),
    sample([5, 6, 7, 8, 9], [60, 61], [1, 1], 0.2),  # a prompt of its own
    Sample([11, 12, 13], [0, 0, 0], [0.0] * 3, 0.0),  # no loss tokens
]


def test_split_groups_samples_by_prompt(tiny_model):
    _, tok = tiny_model
    batch = collate(SAMPLES, pad_id=tok.pad_token_id)
    sp = shared_prompts.split(batch, tok.pad_token_id)
    assert sp is not None
    assert sp.group.tolist() == [0, 0, 0, 1, 1, 2, 3]
    assert sp.start.tolist() == [7, 7, 7, 4, 4, 5, 2]
    assert sp.prefix_ids[1, :4].tolist() == B and sp.prefix_mask[1].sum() == 4
    assert sp.suffix_ids[1, :6].tolist() == [33, 34, 40, 41, 35, 36] and sp.suffix_mask[1].sum() == 6


def test_shared_prompts_give_the_whole_sequence_values_and_gradients(tiny_model):
    model, tok = tiny_model
    batch = collate(SAMPLES, pad_id=tok.pad_token_id)
    sp = shared_prompts.split(batch, tok.pad_token_id)
    mask = batch.loss_mask > 0
    results = []
    for prompts in (None, sp):
        model.zero_grad()
        if prompts is None:
            lp, ent = token_logprobs(model, batch, temperature=0.7)
        else:
            lp, ent = shared_prompts.token_logprobs(model, batch, prompts, temperature=0.7)
        loss, _ = ppo_clip_loss(lp, batch.old_logprobs, batch.advantages, batch.loss_mask, 0.2, entropy=ent, entropy_coef=0.01)
        loss.backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        results.append((lp.detach(), ent.detach(), grads))
    (full_lp, full_ent, full_grad), (lp, ent, grad) = results
    assert torch.all(full_lp[mask] < 0)
    assert torch.allclose(lp[mask], full_lp[mask], atol=1e-5)
    assert torch.allclose(ent[mask], full_ent[mask], atol=1e-4)
    no_loss_anywhere = ~(batch.loss_mask.sum(0, keepdim=True) > 0).expand_as(batch.loss_mask)
    assert torch.all(lp[no_loss_anywhere] == 0)
    assert full_grad.abs().sum() > 0
    assert torch.allclose(grad, full_grad, atol=1e-6)


def test_nothing_shared_means_the_whole_sequences(tiny_model):
    _, tok = tiny_model
    distinct = collate([sample([1, 2, 3], [4, 5], [1, 1], 1.0), sample([1, 2, 6], [4, 5], [1, 1], -1.0)], pad_id=tok.pad_token_id)
    assert shared_prompts.split(distinct, tok.pad_token_id) is None


def test_truncated_samples_share_what_is_left(tiny_model):
    model, tok = tiny_model
    batch = collate(SAMPLES[:3], pad_id=tok.pad_token_id, max_len=9)
    sp = shared_prompts.split(batch, tok.pad_token_id)
    assert sp is not None and sp.suffix_mask.sum(1).tolist() == [2, 2, 1]
    with torch.no_grad():
        full_lp, _ = token_logprobs(model, batch, only_masked=True)
        lp, _ = shared_prompts.token_logprobs(model, batch, sp)
    mask = batch.loss_mask > 0
    assert torch.allclose(lp[mask], full_lp[mask], atol=1e-5)
