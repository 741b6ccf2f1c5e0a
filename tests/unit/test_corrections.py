"""Off-policy corrections against hand-computed values: the behaviour weight of each mode, the loss
that applies it, asymmetric clipping, sequence-level ratios (GSPO), the step's diagnostics; the
decoupled objective equals the plain one when pi_old = pi_rollout, and stays finite with a
behaviour policy made to differ."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl_cli.config.models import TrainingConfig
from agentrl_cli.runtime.observe import keys
from agentrl_cli.learner import corrections
from agentrl_cli.learner.corrections import Correction, behaviour_weights, diagnostics, policy_loss
from agentrl_cli.learner.grpo import ppo_clip_loss
from agentrl_cli.learner.rank_worker import combine_metrics

# Two sequences, five trained tokens: row 0 has three (advantage 2), row 1 two (advantage -1).
MASK = torch.tensor([[0.0, 1.0, 1.0, 1.0], [0.0, 1.0, 1.0, 0.0]])
ADV = torch.tensor([2.0, -1.0])
# rho = pi_old / pi_rollout per trained token: row 0: 0.25, 1.0, 3.0; row 1: 1.5, 0.8
RHO = torch.tensor([[1.0, 0.25, 1.0, 3.0], [1.0, 1.5, 0.8, 1.0]])
ROLLOUT = torch.full((2, 4), -1.0)
OLD = ROLLOUT + RHO.log()


def weights_of(mode: str, **kw) -> corrections.BehaviourWeights:
    return behaviour_weights(OLD, ROLLOUT, MASK, Correction(mode, **kw))


def loss_of(mode: str, new=None, **kw) -> float:
    new = OLD.clone() if new is None else new
    return policy_loss(new, OLD, ROLLOUT, ADV, MASK, Correction(mode, **kw))[0].item()


# ---- each mode's weights and loss, with pi_theta = pi_old (ratio 1: the loss is -mean of A * w) -----

def test_tis_truncates_each_token_weight_at_the_cap():
    w = weights_of("tis", is_cap=2.0)
    assert w.weights[MASK > 0].tolist() == pytest.approx([0.25, 1.0, 2.0, 1.5, 0.8])
    assert w.weights[MASK == 0].tolist() == [0.0, 0.0, 0.0]
    assert not w.rejected.any()
    # (-2 * (0.25 + 1 + 2) + 1 * (1.5 + 0.8)) / 5
    assert loss_of("tis", is_cap=2.0) == pytest.approx(-4.2 / 5)


def test_seq_tis_weighs_every_token_by_its_sequence_product_ratio_truncated():
    # row 0: 0.25 * 1 * 3 = 0.75; row 1: 1.5 * 0.8 = 1.2
    w = weights_of("seq_tis", is_cap=2.0)
    torch.testing.assert_close(w.weights, torch.tensor([[0.0, 0.75, 0.75, 0.75], [0.0, 1.2, 1.2, 0.0]]))
    assert w.raw.tolist() == pytest.approx([0.75, 1.2])
    assert loss_of("seq_tis", is_cap=2.0) == pytest.approx((-2 * 0.75 * 3 + 1.2 * 2) / 5)
    assert loss_of("seq_tis", is_cap=1.0) == pytest.approx((-2 * 0.75 * 3 + 1.0 * 2) / 5)  # 1.2 truncated to 1


def test_mis_drops_tokens_outside_the_thresholds_and_keeps_the_others_weighted():
    w = weights_of("mis", mis_low=0.5, mis_high=2.0)
    assert w.weights[MASK > 0].tolist() == pytest.approx([0.0, 1.0, 0.0, 1.5, 0.8])  # 0.25 and 3.0 dropped
    assert w.rejected.tolist() == [True, False, True, False, False]
    # dropped tokens still count in the denominator: (-2 * 1 + 1.5 + 0.8) / 5
    assert loss_of("mis", mis_low=0.5, mis_high=2.0) == pytest.approx(0.3 / 5)


def test_seq_mis_keeps_or_drops_whole_sequences():
    w = weights_of("seq_mis", mis_low=0.8, mis_high=2.0)  # row 0's 0.75 is below 0.8
    torch.testing.assert_close(w.weights, torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, 1.2, 1.2, 0.0]]))
    assert w.rejected.tolist() == [True, False]
    assert loss_of("seq_mis", mis_low=0.8, mis_high=2.0) == pytest.approx(1.2 * 2 / 5)


def test_decoupled_keeps_weights_untruncated_and_drops_tokens_above_the_cap():
    w = weights_of("decoupled", is_cap=2.0)
    assert w.weights[MASK > 0].tolist() == pytest.approx([0.25, 1.0, 0.0, 1.5, 0.8])  # 3.0 > C: dropped (AReaL)
    assert loss_of("decoupled", is_cap=2.0) == pytest.approx((-2 * (0.25 + 1.0) + 1.5 + 0.8) / 5)


def test_corrected_ratio_is_against_pi_old_and_clipped_asymmetrically():
    new = OLD.clone()
    new[0, 3] += math.log(1.5)  # pi_theta / pi_old = 1.5 here (4.5 against pi_rollout), rho = 3 -> w = 2
    # clip 0.2: ratio 1.5 clipped to 1.2 for A = 2: (-2 * 0.25 - 2 * 1 - 2 * 1.2 * 2 + 1.5 + 0.8) / 5
    assert loss_of("tis", new, is_cap=2.0) == pytest.approx(-5.0 / 5)
    # clip_high 0.6: 1.5 is inside [0.8, 1.6]: (-0.5 - 2 - 2 * 1.5 * 2 + 2.3) / 5
    assert loss_of("tis", new, is_cap=2.0, clip_high=0.6) == pytest.approx(-6.2 / 5)


def test_clip_ratio_low_bounds_the_ratio_from_below_only():
    new = ROLLOUT.clone()
    new[1, 1] += math.log(0.5)  # ratio 0.5 at a token with A = -1: max(0.5, 1 - low) counts
    _, m = ppo_clip_loss(new, ROLLOUT, ADV, MASK, 0.2, clip_eps_high=5.0)
    plain = ppo_clip_loss(new, ROLLOUT, ADV, MASK, 0.2)[0].item()
    wide = ppo_clip_loss(new, ROLLOUT, ADV, MASK, 0.6, clip_eps_high=0.2)[0].item()
    assert plain == pytest.approx((-2 * 3 + 0.8 + 1.0) / 5)
    assert wide == pytest.approx((-2 * 3 + 0.5 + 1.0) / 5)
    assert m["clip_fraction"] == pytest.approx(1 / 5)


# ---- GSPO: sequence-level ratio ----------------------------------------------------------------

def test_sequence_ratio_gives_every_token_the_geometric_mean_ratio_of_its_sequence():
    new = ROLLOUT.clone()
    new[0, 1] += math.log(2.0)  # row 0: ratios 2, 1, 1 -> sequence ratio 2^(1/3) = 1.26 > 1.2, clipped (A = 2)
    new[1, 1] += math.log(0.5)  # row 1: ratios 0.5, 1 -> 0.5^(1/2) = 0.707 < 0.8; A = -1 keeps max(0.707, 0.8)
    seq = policy_loss(new, None, ROLLOUT, ADV, MASK, Correction(ratio_level="sequence"))[0].item()
    tok = policy_loss(new, None, ROLLOUT, ADV, MASK, Correction())[0].item()
    assert seq == pytest.approx((-2 * 1.2 * 3 + 0.8 * 2) / 5)
    assert tok == pytest.approx((-2 * 1.2 - 2 - 2 + 0.8 + 1.0) / 5)


def test_sequence_ratio_spreads_one_tokens_gradient_over_its_whole_sequence():
    new = ROLLOUT.clone()
    new[0, 1] += math.log(1.1)  # row 0's sequence ratio 1.1^(1/3): inside the clip range
    new.requires_grad_()
    loss, _ = policy_loss(new, None, ROLLOUT, ADV, MASK, Correction(ratio_level="sequence"))
    loss.backward()
    # row 0's loss: 3 tokens * -2 * r / 5, r = exp(sum / 3): d/d new[0, t] = -6/5 * r / 3 for each of its tokens
    r = 1.1 ** (1 / 3)
    assert new.grad[0, 1:].tolist() == pytest.approx([-0.4 * r] * 3)
    assert new.grad[0, 0].item() == 0.0


# ---- equalities and a behaviour policy made to differ ------------------------------------------------

def _random_logprobs(seed: int, shape=(6, 12)) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return -torch.rand(shape, generator=g) * 4.0 - 0.05


def _mask(shape=(6, 12)) -> torch.Tensor:
    m = torch.zeros(shape)
    m[:, 3:] = 1.0
    m[2, 9:] = 0.0
    return m


@pytest.mark.parametrize("mode", ["decoupled", "tis", "seq_tis", "mis", "seq_mis"])
def test_corrected_objective_equals_the_plain_one_when_pi_old_equals_pi_rollout(mode):
    rollout, mask = _random_logprobs(1), _mask()
    adv = torch.linspace(-1.5, 1.5, 6)
    start = rollout + 0.3 * torch.randn(rollout.shape, generator=torch.Generator().manual_seed(2))
    a, b = start.clone().requires_grad_(), start.clone().requires_grad_()
    plain, pm = policy_loss(a, None, rollout, adv, mask, Correction("none"))
    corrected, cm = policy_loss(b, rollout.clone(), rollout, adv, mask, Correction(mode))
    plain.backward()
    corrected.backward()
    assert corrected.item() == pytest.approx(plain.item(), abs=1e-7)
    torch.testing.assert_close(b.grad, a.grad)
    assert cm == pytest.approx(pm)


@pytest.mark.parametrize("mode", ["tis", "seq_tis", "mis", "seq_mis", "decoupled"])
def test_a_behaviour_policy_made_to_differ_gives_nontrivial_weights_and_a_finite_loss(mode):
    old, mask = _random_logprobs(3), _mask()
    noise = 0.6 * torch.randn(old.shape, generator=torch.Generator().manual_seed(4))
    rollout = torch.where(mask > 0, old + noise, 0.0)  # seeded noise on the server's log-probs
    wide = mode == "seq_mis"  # a sequence's product of 9 noisy ratios is far more spread than one token's
    correction = Correction(mode, is_cap=2.0, mis_low=0.2 if wide else 0.5, mis_high=5.0 if wide else 2.0)
    w = behaviour_weights(old, rollout, mask, correction)
    d = diagnostics(w.raw, w.applied, w.rejected)
    assert d[corrections.WEIGHT_MAX] > 1.2 and d[corrections.WEIGHT_MEAN] != pytest.approx(1.0, abs=1e-3)
    assert 0.0 < d[corrections.ESS] < 1.0
    if mode in ("mis", "seq_mis", "decoupled"):
        assert 0.0 < d[corrections.REJECTED_FRACTION] < 1.0
    else:
        assert d[corrections.REJECTED_FRACTION] == 0.0
    new = (old + 0.1).requires_grad_()
    loss, m = policy_loss(new, old, rollout, torch.linspace(-1, 1, 6), mask, correction, w.weights)
    loss.backward()
    assert math.isfinite(loss.item()) and torch.isfinite(new.grad).all() and all(map(math.isfinite, m.values()))


def test_a_long_sequence_product_ratio_stays_finite():
    mask = torch.ones(1, 400)
    mask[0, 0] = 0.0
    w = behaviour_weights(torch.zeros(1, 400), torch.full((1, 400), -1.0), mask, Correction("seq_tis", is_cap=3.0))
    assert w.weights[0, 1].item() == pytest.approx(3.0) and math.isfinite(w.raw.item())


def test_none_needs_no_pi_old_and_the_others_refuse_to_run_without_it():
    assert not Correction("none").needs_old_logprobs
    with pytest.raises(ValueError, match="needs pi_old"):
        policy_loss(OLD, None, ROLLOUT, ADV, MASK, Correction("tis"))
    with pytest.raises(ValueError, match="unknown correction 'bogus'"):
        Correction("bogus")


# ---- diagnostics ------------------------------------------------------------------------------

def test_diagnostics_match_hand_values_for_tis():
    w = weights_of("tis", is_cap=2.0)
    d = diagnostics(w.raw, w.applied, w.rejected)
    assert d[corrections.WEIGHT_MEAN] == pytest.approx((0.25 + 1.0 + 3.0 + 1.5 + 0.8) / 5)
    assert d[corrections.WEIGHT_MAX] == pytest.approx(3.0)
    assert d[corrections.WEIGHT_P99] == pytest.approx(3.0)  # n = 5: the ceil(4.95) = 5th smallest
    # applied 0.25, 1, 2, 1.5, 0.8: sum 5.55, sum of squares 7.9525
    assert d[corrections.ESS] == pytest.approx(5.55 ** 2 / 7.9525 / 5)
    assert d[corrections.REJECTED_FRACTION] == 0.0


def test_diagnostics_count_sequences_in_sequence_modes_and_rejections_in_mis():
    w = weights_of("seq_mis", mis_low=0.8, mis_high=2.0)
    d = diagnostics(w.raw, w.applied, w.rejected)
    assert d[corrections.WEIGHT_MEAN] == pytest.approx((0.75 + 1.2) / 2)
    assert d[corrections.REJECTED_FRACTION] == 0.5
    assert d[corrections.ESS] == pytest.approx(1.2 ** 2 / 1.2 ** 2 / 2)  # one of two sequences carries the step


def test_p99_is_the_nearest_rank_percentile_and_ess_is_one_for_equal_weights():
    raw = torch.arange(1, 201, dtype=torch.float32)  # 1..200: the 198th smallest is 198
    d = diagnostics(raw, torch.ones(200), torch.zeros(200, dtype=torch.bool))
    assert d[corrections.WEIGHT_P99] == 198.0 and d[corrections.WEIGHT_MAX] == 200.0
    assert d[corrections.ESS] == pytest.approx(1.0)
    assert diagnostics(torch.ones(0), torch.ones(0), torch.zeros(0, dtype=torch.bool)) == {}
    assert diagnostics(torch.ones(2), torch.zeros(2), torch.ones(2, dtype=torch.bool))[corrections.ESS] == 0.0


def test_policy_lag_is_the_token_weighted_staleness_of_the_trained_samples():
    tokens = torch.tensor([3.0, 1.0, 0.0])
    assert corrections.policy_lag([0, 2, None], tokens) == pytest.approx((0 * 3 + 2 * 1) / 4)  # padding skipped
    assert corrections.policy_lag([0, None, None], tokens) is None  # a trained sample without it: unknown
    assert corrections.policy_lag([None, None, None], torch.zeros(3)) is None


def test_diagnostic_names_are_the_train_keys_of_keys_py():
    names = {corrections.WEIGHT_MEAN, corrections.WEIGHT_MAX, corrections.WEIGHT_P99, corrections.ESS,
             corrections.REJECTED_FRACTION}
    assert {f"train/{n}" for n in names} == set(keys.TRAIN_CORRECTION)
    assert f"train/{corrections.POLICY_LAG}" == keys.TRAIN_POLICY_LAG


def test_ranks_combine_policy_lag_by_tokens_and_take_the_gathered_weight_figures_from_rank_0():
    base = {"loss": 1.0, corrections.ESS: 0.7, corrections.WEIGHT_MAX: 4.0}
    out = combine_metrics([{**base, "tokens": 30, corrections.POLICY_LAG: 1.0},
                           {**base, "tokens": 10, corrections.POLICY_LAG: 3.0}, {**base, "tokens": 0}])
    assert out[corrections.POLICY_LAG] == pytest.approx((30 * 1.0 + 10 * 3.0) / 40)
    assert out[corrections.ESS] == 0.7 and out[corrections.WEIGHT_MAX] == 4.0


# ---- config ---------------------------------------------------------------------------------------

def test_unset_clip_ratios_take_clip_eps_and_set_ones_win():
    c = Correction.from_config(TrainingConfig(clip_eps=0.3))
    assert (c.mode, c.clip_low, c.clip_high, c.ratio_level) == ("none", 0.3, 0.3, "token")
    c = Correction.from_config(TrainingConfig(clip_ratio_high=0.28, correction="mis", mis_low=0.25, mis_high=4.0,
                                              ratio_level="sequence", is_cap=5.0))
    assert (c.clip_low, c.clip_high, c.mis_low, c.mis_high, c.ratio_level, c.is_cap) == (0.2, 0.28, 0.25, 4.0, "sequence", 5.0)


@pytest.mark.parametrize("bad", [{"correction": "rejection"}, {"is_cap": 0.5}, {"mis_low": 1.0}, {"mis_high": 1.0},
                                 {"clip_ratio_low": 1.0}, {"ratio_level": "group"}])
def test_config_refuses_values_outside_the_rules(bad):
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        TrainingConfig(**bad)
