"""GRPO maths against hand-computed values: advantages, batching, log-probs, PPO-clip, mismatch KL."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from agentrl_cli.learner.grpo import (Sample, collate, group_advantages, mismatch_kl, ppo_clip_loss,
                                       sequence_weights, token_logprobs)

# ---- advantages ---------------------------------------------------------------------------------

REWARDS = [1.0, 2.0, 0.0, 4.0, None, 6.0]
GROUPS = ["a", "b", "a", "b", "a", "b"]
# group a: valid rewards 1, 0 -> mean 0.5, sample std sqrt(0.5); the None gets 0 and is left out
# group b: 2, 4, 6 -> mean 4, sample std 2


def test_group_advantages_normalise_within_each_group_and_zero_masked_rewards():
    adv = group_advantages(REWARDS, GROUPS, eps=0.0)
    s = 0.5 / math.sqrt(0.5)
    assert adv == pytest.approx([s, -1.0, -s, 0.0, 0.0, 1.0])


def test_group_advantages_without_scaling_only_subtract_the_group_mean():
    assert group_advantages(REWARDS, GROUPS, scale=False) == pytest.approx([0.5, -2.0, -0.5, 0.0, 0.0, 2.0])


def test_group_with_equal_rewards_or_one_valid_reward_has_zero_advantages():
    adv = group_advantages([0.3, 0.3, 0.3, 1.0, None], ["x", "x", "x", "y", "y"])
    assert adv == [0.0, 0.0, 0.0, 0.0, 0.0]


def test_group_advantages_reject_mismatched_lengths_and_nan():
    with pytest.raises(ValueError, match="group id per reward"):
        group_advantages([1.0, 2.0], ["a"])
    with pytest.raises(ValueError, match="not finite"):
        group_advantages([float("nan"), 1.0], ["a", "a"])


# ---- collate ------------------------------------------------------------------------------------

def test_collate_right_pads_and_drops_position_zero_from_the_mask():
    samples = [Sample([5, 6, 7], [1, 1, 1], [-0.1, -0.2, -0.3], 1.5),
               Sample(np.array([8, 9]), np.array([0, 1]), np.array([0.0, -0.4]), -0.5)]
    b = collate(samples, pad_id=0)
    assert b.input_ids.tolist() == [[5, 6, 7], [8, 9, 0]]
    assert b.attention_mask.tolist() == [[1, 1, 1], [1, 1, 0]]
    assert b.loss_mask.tolist() == [[0, 1, 1], [0, 1, 0]]
    torch.testing.assert_close(b.old_logprobs, torch.tensor([[0.0, -0.2, -0.3], [0.0, -0.4, 0.0]]))
    assert b.advantages.tolist() == [1.5, -0.5]
    assert b.num_tokens == 3


def test_collate_truncates_from_the_right_with_the_mask():
    b = collate([Sample([1, 2, 3, 4, 5], [0, 1, 0, 1, 1], [0.0, -1, 0, -2, -3], 1.0)], pad_id=0, max_len=4)
    assert b.input_ids.tolist() == [[1, 2, 3, 4]]
    assert b.loss_mask.tolist() == [[0, 1, 0, 1]]
    assert b.old_logprobs.tolist() == [[0.0, -1.0, 0.0, -2.0]]


def test_collate_rejects_samples_whose_arrays_disagree_in_length():
    with pytest.raises(ValueError, match="sample 0 .* lengths 3/2/3"):
        collate([Sample([1, 2, 3], [0, 1], [0.0, 0.0, 0.0], 1.0)], pad_id=0)


# ---- PPO-clip loss ------------------------------------------------------------------------------

MASK = torch.tensor([[0.0, 1.0, 1.0, 0.0], [0.0, 1.0, 0.0, 0.0]])
ADV = torch.tensor([2.0, -1.0])


def test_loss_is_minus_the_token_mean_advantage_when_policy_unchanged():
    lp = torch.full((2, 4), -1.3)
    loss, m = ppo_clip_loss(lp, lp.clone(), ADV, MASK, clip_eps=0.2)
    # masked tokens: two with A=2, one with A=-1 -> mean A = 1 -> loss -1
    assert loss.item() == pytest.approx(-1.0)
    assert m["clip_fraction"] == 0.0 and m["approx_kl"] == pytest.approx(0.0, abs=1e-7)


def test_num_tokens_divides_the_summed_token_loss_instead_of_the_batch_count():
    lp = torch.zeros(2, 4)
    loss, _ = ppo_clip_loss(lp, lp.clone(), ADV, MASK, clip_eps=0.2, num_tokens=6)
    assert loss.item() == pytest.approx(-3.0 / 6)


def test_sequence_weights_make_every_sequence_weigh_the_same():
    lp = torch.full((2, 4), -1.3)
    # row 0: two masked tokens with A=2; row 1: one masked token with A=-1 -> sequence means 2 and -1
    loss, m = ppo_clip_loss(lp, lp.clone(), ADV, MASK, clip_eps=0.2, token_weights=sequence_weights(MASK, 2))
    assert loss.item() == pytest.approx(-(2.0 + -1.0) / 2)
    assert m["clip_fraction"] == 0.0  # metrics stay token means
    # split into two micro-batches of one row each, weighted by the step's sequence count: same sum
    parts = [ppo_clip_loss(lp[i:i + 1], lp[i:i + 1].clone(), ADV[i:i + 1], MASK[i:i + 1], clip_eps=0.2,
                           token_weights=sequence_weights(MASK[i:i + 1], 2))[0].item() for i in range(2)]
    assert sum(parts) == pytest.approx(loss.item())


def _grad_at(new: float, old: float, adv: float, eps: float = 0.2) -> float:
    new_lp = torch.tensor([[0.0, new]], requires_grad=True)
    loss, _ = ppo_clip_loss(new_lp, torch.tensor([[0.0, old]]), torch.tensor([adv]), torch.tensor([[0.0, 1.0]]), eps)
    loss.backward()
    return new_lp.grad[0, 1].item()


def test_clipped_tokens_get_no_gradient_when_clipping_would_raise_the_objective():
    assert _grad_at(math.log(1.5), 0.0, adv=1.0) == 0.0     # ratio 1.5 > 1.2, A > 0
    assert _grad_at(math.log(0.5), 0.0, adv=-1.0) == 0.0    # ratio 0.5 < 0.8, A < 0


def test_unclipped_and_pessimistic_side_tokens_keep_the_ratio_gradient():
    # d(-A * ratio)/d new_lp = -A * ratio for one masked token
    assert _grad_at(math.log(1.1), 0.0, adv=1.0) == pytest.approx(-1.1)
    assert _grad_at(math.log(0.5), 0.0, adv=1.0) == pytest.approx(-0.5)   # ratio low but A > 0: not clipped
    assert _grad_at(math.log(1.5), 0.0, adv=-1.0) == pytest.approx(1.5)   # ratio high but A < 0: not clipped


def test_tokens_outside_the_mask_change_neither_loss_nor_gradient():
    torch.manual_seed(0)
    new = torch.randn(2, 4)
    old = torch.randn(2, 4)
    new2, old2 = new.clone(), old.clone()
    outside = MASK == 0
    new2[outside] = 50.0
    old2[outside] = float("-inf")
    a = new.clone().requires_grad_()
    b = new2.clone().requires_grad_()
    la, ma = ppo_clip_loss(a, old, ADV, MASK, 0.2, entropy=torch.rand(2, 4), entropy_coef=0.0)
    lb, mb = ppo_clip_loss(b, old2, ADV, MASK, 0.2, entropy=torch.rand(2, 4), entropy_coef=0.0)
    la.backward()
    lb.backward()
    assert lb.item() == pytest.approx(la.item())
    assert torch.equal(a.grad, b.grad) and torch.all(b.grad[outside] == 0)
    assert mb["approx_kl"] == pytest.approx(ma["approx_kl"])


def test_metrics_match_hand_values_for_one_token_with_doubled_probability():
    new, old = torch.tensor([[0.0, math.log(2.0)]]), torch.zeros(1, 2)
    ent = torch.tensor([[9.0, 1.5]])
    ref = torch.tensor([[0.0, 0.0]])
    loss, m = ppo_clip_loss(new, old, torch.tensor([1.0]), torch.tensor([[0.0, 1.0]]), 0.2,
                            kl_coef=0.5, ref_lp=ref, entropy=ent, entropy_coef=0.1)
    k3 = 0.5 - math.log(0.5) - 1.0  # exp(ref - new) - (ref - new) - 1
    assert m["clip_fraction"] == 1.0
    assert m["approx_kl"] == pytest.approx(1.0 - math.log(2.0))
    assert m["entropy"] == pytest.approx(1.5)
    assert m["kl_ref"] == pytest.approx(k3)
    assert loss.item() == pytest.approx(-1.2 + 0.5 * k3 - 0.1 * 1.5)


# ---- mismatch KL --------------------------------------------------------------------------------

def test_mismatch_kl_is_zero_for_identical_log_probs_and_positive_otherwise():
    lp = torch.tensor([[0.0, -1.0, -2.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0]])
    assert mismatch_kl(lp, lp.clone(), mask).item() == 0.0
    other = lp.clone()
    other[0, 1] += math.log(2.0)
    assert mismatch_kl(lp, other, mask).item() == pytest.approx((1.0 - math.log(2.0)) / 2)
    other[0, 0] = 100.0  # outside the mask: ignored
    assert mismatch_kl(lp, other, mask).item() == pytest.approx((1.0 - math.log(2.0)) / 2)


# ---- log-probs from a model ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_model():
    from agentrl_cli.model.tiny import init_model

    model, tokenizer = init_model(seed=3, num_hidden_layers=1)
    return model.eval(), tokenizer


def test_token_logprobs_equal_a_manual_log_softmax_gather(tiny_model):
    model, tok = tiny_model
    samples = [Sample([10, 20, 30, 40, 50], [0, 0, 1, 1, 1], [0.0] * 5, 1.0), Sample([7, 8, 9], [0, 1, 1], [0.0] * 3, 1.0)]
    batch = collate(samples, pad_id=tok.pad_token_id)
    with torch.no_grad():
        lp, ent = token_logprobs(model, batch, temperature=0.7)
        for b, s in enumerate(samples):
            logits = model(input_ids=torch.tensor([s.token_ids])).logits[0] / 0.7
            manual = F.log_softmax(logits, -1)
            assert lp[b, 0].item() == 0.0 and ent[b, 0].item() == 0.0
            for t in range(1, len(s.token_ids)):
                assert lp[b, t].item() == pytest.approx(manual[t - 1, s.token_ids[t]].item(), abs=1e-5)
                assert ent[b, t].item() == pytest.approx(-(manual[t - 1].exp() * manual[t - 1]).sum().item(), abs=1e-4)
