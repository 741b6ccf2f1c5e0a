"""`token_logprobs(only_masked=True)`: the train step's log-probs and entropy computed only where the
loss reads them are the same values as the full computation there, and zero elsewhere."""

from __future__ import annotations

import pytest
import torch

from agentrl_cli.learner.grpo import Sample, collate, ppo_clip_loss, token_logprobs


@pytest.fixture(scope="module")
def tiny_model():
    from agentrl_cli.model.tiny import init_model

    model, tokenizer = init_model(seed=5, num_hidden_layers=1)
    return model.eval(), tokenizer


def _batch(tok):
    samples = [Sample([10, 20, 30, 40, 50, 60, 70], [0, 0, 1, 1, 0, 1, 1], [-1.0] * 7, 1.0),  # model, tool, model tokens
               Sample([7, 8, 9, 11], [0, 0, 0, 1], [-1.0] * 4, -1.0)]
    return collate(samples, pad_id=tok.pad_token_id)


def test_only_masked_positions_match_the_full_computation(tiny_model):
    model, tok = tiny_model
    batch = _batch(tok)
    with torch.no_grad():
        full_lp, full_ent = token_logprobs(model, batch, temperature=0.7)
        lp, ent = token_logprobs(model, batch, temperature=0.7, only_masked=True)
    mask = batch.loss_mask > 0
    assert torch.allclose(lp[mask], full_lp[mask], atol=1e-5)
    assert torch.allclose(ent[mask], full_ent[mask], atol=1e-4)
    never_kept = ~(batch.loss_mask.sum(0, keepdim=True) > 0).expand_as(batch.loss_mask)
    assert torch.all(lp[never_kept] == 0) and torch.all(ent[never_kept] == 0)


def test_only_masked_gives_the_same_loss_gradient(tiny_model):
    model, tok = tiny_model
    batch = _batch(tok)
    grads = []
    for only in (False, True):
        model.zero_grad()
        lp, ent = token_logprobs(model, batch, only_masked=only)
        loss, _ = ppo_clip_loss(lp, batch.old_logprobs, batch.advantages, batch.loss_mask, 0.2, entropy=ent, entropy_coef=0.01)
        loss.backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    assert grads[0].abs().sum() > 0
    assert torch.allclose(grads[0], grads[1], atol=1e-6)
