"""Sequence packing (`training.max_tokens_per_micro_batch`, `packing.py`): the bins respect the
budget, positions restart per sample, packed samples do not see each other, and the loss, its
gradients and a whole DeepSpeed train step are those of right-padded micro-batches."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from agentrl_cli.core.errors import ConfigError
from agentrl_cli.learner import corrections, packing
from agentrl_cli.learner.grpo import LOSS_AGGREGATIONS, Sample, aggregation_weights, collate, token_logprobs

VOCAB = 96
PAD = 0


def tiny_llama(attn: str = "sdpa", seed: int = 5) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, pad_token_id=PAD)
    config._attn_implementation = attn
    return LlamaForCausalLM(config).eval()


def make_samples(lengths: list[int], seed: int = 0) -> list[Sample]:
    """Prompt (a third, masked), then model tokens with a masked tool stretch in the longer ones."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, n in enumerate(lengths):
        ids = torch.randint(1, VOCAB, (n,), generator=g).tolist()
        mask = [0] * (n // 3) + [1] * (n - n // 3)
        if n >= 12:
            mask[n // 3 + 2:n // 3 + 4] = [0, 0]
        rollout = (-math.log(VOCAB) + 0.05 * torch.randn(n, generator=g)).tolist()  # near the random model's own
        out.append(Sample(ids, mask, rollout, advantage=(-1.0) ** i * (0.3 + 0.1 * i)))
    return out


LENGTHS = [23, 7, 15, 4, 19, 11, 2]


def test_bins_hold_at_most_the_budget_and_every_sample_once():
    lengths = [9, 3, 7, 2, 8, 5, 1, 6]
    bins = packing.plan(lengths, 10)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in b) <= 10 for b in bins)
    assert len(bins) == 5  # 41 tokens need at least 5 bins of 10; first-fit decreasing finds 5


def test_a_sample_longer_than_the_budget_gets_a_bin_of_its_own():
    bins = packing.plan([4, 30, 5, 12], 10)
    assert [1] in bins and [3] in bins
    assert sorted(sorted(b) for b in bins if 1 not in b and 3 not in b) == [[0, 2]]


def test_fill_adds_empty_bins_up_to_the_ranks_largest_count():
    assert packing.fill([[0, 2], [1]], 4) == [[0, 2], [1], [], []]
    with pytest.raises(ValueError):
        packing.fill([[0], [1], [2]], 2)


def test_positions_restart_at_zero_for_each_sample_and_padding_is_left_out():
    batch = collate(make_samples([5, 3, 4]), PAD)
    row = packing.pack(batch)
    assert row.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3]]
    assert row.input_ids[0].tolist() == batch.input_ids[0, :5].tolist() + batch.input_ids[1, :3].tolist() + batch.input_ids[2, :4].tolist()
    assert row.num_samples == 3
    # every loss token is predicted from the position before it in its own sample
    assert (row.input_ids[0, row.keep + 1] == batch.input_ids[row.rows, row.columns]).all()
    assert int(batch.loss_mask.sum()) == len(row.keep)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_logprobs_equal_the_padded_ones(attn):
    model = tiny_llama(attn)
    batch = collate(make_samples(LENGTHS), PAD)
    with torch.no_grad():
        lp, ent = token_logprobs(model, batch, temperature=0.8)
        plp, pent = packing.token_logprobs(model, batch, packing.pack(batch), temperature=0.8)
    mask = batch.loss_mask > 0
    assert torch.allclose(plp[mask], lp[mask], atol=1e-5) and torch.allclose(pent[mask], ent[mask], atol=1e-5)
    assert (plp[~mask] == 0).all()


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_changing_one_packed_sample_leaves_the_others_log_probs_alone(attn):
    model = tiny_llama(attn)
    samples = make_samples([9, 14, 6])
    changed = list(samples)
    changed[0] = Sample([(t * 7 + 3) % (VOCAB - 1) + 1 for t in samples[0].token_ids], samples[0].loss_mask,
                        samples[0].logprobs, samples[0].advantage)
    results = []
    for group in (samples, changed):
        batch = collate(group, PAD)
        with torch.no_grad():
            results.append(packing.token_logprobs(model, batch, packing.pack(batch))[0])
    assert not torch.allclose(results[0][0], results[1][0], atol=1e-3)  # the changed sample did change
    assert torch.allclose(results[0][1:], results[1][1:], atol=1e-6)


def test_a_model_that_attends_across_samples_is_refused():
    class Leaky(torch.nn.Module):
        """A Llama fed a 2D attention mask, which transformers reads as one long sequence."""

        def __init__(self):
            super().__init__()
            self.inner = tiny_llama()
            self.config = self.inner.config

        def forward(self, input_ids, position_ids=None, **kwargs):
            return self.inner(input_ids=input_ids, position_ids=position_ids,
                              attention_mask=torch.ones_like(input_ids), **kwargs)

    packing.check_isolation(tiny_llama(), "cpu")  # the plain model passes
    with pytest.raises(ConfigError, match="attends across packed samples"):
        packing.check_isolation(Leaky(), "cpu")


CASES = [(mode, corrections.Correction()) for mode in LOSS_AGGREGATIONS] + [
    ("seq_mean", corrections.Correction("seq_tis", ratio_level="sequence")),
    ("token_mean", corrections.Correction("seq_mis", mis_low=0.2, mis_high=5.0)),
]


@pytest.mark.parametrize("aggregation,correction", CASES, ids=[f"{a}-{c.mode}-{c.ratio_level}" for a, c in CASES])
def test_packed_micro_batches_give_the_padded_loss_and_gradients(aggregation, correction):
    """One padded micro-batch of every sample against packed bins of 30 tokens (several samples per
    bin, one sample over the budget alone), with the step's token and sequence counts."""
    model = tiny_llama()
    model.train()
    samples = make_samples(LENGTHS + [40])
    padded = collate(samples, PAD)
    total, sequences = padded.num_tokens, int((padded.loss_mask.sum(dim=1) > 0).sum())

    def step(batches_and_forwards) -> tuple[float, dict[str, torch.Tensor]]:
        model.zero_grad()
        loss_sum = 0.0
        for batch, forward in batches_and_forwards:
            with torch.no_grad():
                old = forward(batch)[0] if correction.needs_old_logprobs else None
            lp, ent = forward(batch)
            loss, _ = corrections.policy_loss(lp, old, batch.old_logprobs, batch.advantages, batch.loss_mask, correction,
                                              entropy=ent, entropy_coef=0.01, num_tokens=total,
                                              token_weights=aggregation_weights(aggregation, batch.loss_mask, sequences))
            loss.backward()
            loss_sum += float(loss.detach())
        return loss_sum, {n: p.grad.clone() for n, p in model.named_parameters()}

    whole = step([(padded, lambda b: token_logprobs(model, b))])
    bins = packing.plan([len(s.token_ids) for s in samples], 30)
    assert len(bins) >= 3 and any(len(b) > 1 for b in bins) and [len(samples) - 1] in bins
    packed_batches = [collate([samples[i] for i in b], PAD) for b in bins]
    packed = step([(b, lambda b, row=packing.pack(b): packing.token_logprobs(model, b, row)) for b in packed_batches])
    assert packed[0] == pytest.approx(whole[0], abs=1e-5) and abs(whole[0]) > 1e-3
    for name, grad in whole[1].items():
        assert torch.allclose(packed[1][name], grad, atol=1e-5), name
    assert max(g.abs().max() for g in whole[1].values()) > 1e-3


def test_a_filler_micro_batch_has_no_loss_token_and_a_zero_gradient():
    model = tiny_llama()
    batch = collate([packing.filler(make_samples([10])[0])], PAD)
    assert batch.num_tokens == 0 and batch.input_ids.shape == (1, 2)
    lp, ent = packing.token_logprobs(model, batch, packing.pack(batch))
    loss, _ = corrections.policy_loss(lp, None, batch.old_logprobs, batch.advantages, batch.loss_mask,
                                      corrections.Correction(), entropy=ent, num_tokens=5)
    loss.backward()
    assert float(loss.detach()) == 0.0
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None for g in grads) and all((g == 0).all() for g in grads)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from agentrl_cli.model.tiny import build_random

    return build_random(tmp_path_factory.mktemp("packing") / "tiny", seed=3)


def test_a_packed_train_step_trains_as_the_padded_one(model_dir):
    """The DeepSpeed backend on the built-in model: with packing the step's loss, metrics and updated
    weights are those of right-padded micro-batches (seq_mean, seq_tis with pi_old, a KL reference)."""
    from agentrl_cli.config.models import TrainingConfig
    from agentrl_cli.learner.deepspeed_backend import DeepSpeedBackend

    samples = make_samples([30, 12, 21, 9, 17, 5])
    for i, s in enumerate(samples):
        s.staleness = float(i)  # bins reorder samples: the lag must still pair each with its own tokens
    results = []
    for budget in (0, 40):
        cfg = TrainingConfig(micro_batch_size=3, learning_rate=1e-3, zero_stage=2, max_tokens_per_micro_batch=budget,
                             loss_aggregation="seq_mean", correction="seq_tis", kl_coef=0.05)
        backend = DeepSpeedBackend(model_dir, cfg)
        try:
            metrics = backend.train_step(samples)
            names = [n for n, _ in backend.module.named_parameters()]
            params = {n: torch.tensor(v) for n, v in backend.named_parameter_sample(names, 10**9).items()}
        finally:
            backend.close()
        results.append((metrics, params))
    (padded, padded_params), (packed, packed_params) = results
    for key in ("loss", "grad_norm", "entropy", "mismatch_kl", "clip_fraction", "kl_ref", "tokens",
                corrections.WEIGHT_MEAN, corrections.POLICY_LAG):
        assert packed[key] == pytest.approx(padded[key], rel=1e-4, abs=1e-6), key
    for name, value in padded_params.items():
        assert torch.allclose(packed_params[name], value, atol=1e-5), name
