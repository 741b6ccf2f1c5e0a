"""Per-turn credit (`training.advantage: turn`, learner/turn_credit.py): `episode` mode's advantages
pinned exactly as they were before turn mode existed (golden), a step reward at turn k moving turn k's
tokens and no other turn's, gamma > 0 passing it back by gamma^(k - j), the per-turn baseline leaving
out episodes too short for the turn, the per-token advantages through collate and the loss, the
row's metrics, and the refusal at load of a harness without step rewards."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from agentrl_cli.config import load_config
from agentrl_cli.core.errors import ConfigError
from agentrl_cli.learner.grpo import Sample, collate, ppo_clip_loss
from agentrl_cli.learner.turn_credit import step_returns, turn_spans
from agentrl_cli.run.loop.samples import SampleBuilder
from agentrl_cli.runtime.observe import keys
from agentrl_cli.runtime.rollout.buffer import Episode

MASK = [0, 0, 1, 1, 0, 1, 1, 1, 0, 0, 1]  # three model turns: tokens 2-3, 5-7, 10
TURNS = [(2, 4), (5, 8), (10, 11)]
TURN_HARNESS = ["harnesses=" + '[{"name": "openenv"}]']


def cfg_with(*sets: str):
    return load_config(None, ["rollout.group_size=3", *sets], env={}).config


def record(step_rewards, mask=MASK, segments=None, role=None, step_roles=None):
    n = len(mask)
    roles = step_roles or [role] * len(step_rewards)
    return SimpleNamespace(token_ids=list(range(1, n + 1)), loss_mask=list(mask), logprobs=[-0.5] * n,
                           segment_starts=segments, outcome="fail", role=role,
                           steps=[SimpleNamespace(reward=r, role=ro) for r, ro in zip(step_rewards, roles)])


def batch():
    """Two groups of three multi-turn episodes: a segmented one, a masked one, step rewards at turns 0 and 1."""
    return [Episode("a", record([0, 1, 0]), 0, 1.0, 6), Episode("a", record([0, 0, 0]), 0, 0.0, 6),
            Episode("a", record([0, 0, 0], segments=[0, 5]), 0, 0.5, 6), Episode("b", record([0, 0, 0]), 0, 0.25, 6),
            Episode("b", record([0, 0, 0]), 0, None, 6), Episode("b", record([1, 0, 0]), 0, 0.75, 6)]


def per_token(cfg, episodes):
    samples, row = SampleBuilder(cfg)([episodes], 0)
    b = collate(samples, 0)
    adv = b.advantages if b.advantages.dim() == 2 else b.advantages.unsqueeze(-1).expand_as(b.loss_mask)
    return b, adv * b.loss_mask, row


def test_episode_mode_reproduces_the_advantages_of_before_turn_credit_exactly():
    b, tokens, row = per_token(cfg_with(), batch())
    # pinned from the code before training.advantage existed: a [B] tensor, one float per sample
    assert b.advantages.shape == (6,) and b.advantages.tolist() == [
        0.9999979734420776, -0.9999979734420776, 0.0, 0.0, -0.7071048021316528, 0.7071048021316528]
    assert tokens[0].tolist() == [0.0, 0.0] + [0.9999979734420776] * 2 + [0.0] + [0.9999979734420776] * 3 + [0.0, 0.0, 0.9999979734420776]
    assert not {keys.ADVANTAGE_TURN_SPREAD, keys.ADVANTAGE_STEP_SHARE, keys.ROLLOUT_TURN_UNMAPPED} & set(row)


def turn_advantages(cfg, rewards_by_episode, outcome=(1.0, 0.0, 0.5)):
    eps = [Episode("g", record(r), 0, o, 6) for r, o in zip(rewards_by_episode, outcome)]
    samples, row = SampleBuilder(cfg)([eps], 0)
    return [[float(np.asarray(s.advantage)[a]) for a, _ in TURNS] for s in samples], samples, row


@pytest.mark.parametrize("k", [0, 1, 2])
def test_a_step_reward_at_turn_k_moves_turn_k_tokens_and_no_other_turn(k):
    cfg = cfg_with("training.advantage=turn", *TURN_HARNESS)
    base, _, _ = turn_advantages(cfg, [[0, 0, 0]] * 3)
    rewarded = [[0, 0, 0], [0, 0, 0], [0, 0, 0]]
    rewarded[0][k] = 1.0
    moved, samples, _ = turn_advantages(cfg, rewarded)
    for i in range(3):
        for t in range(3):
            assert (moved[i][t] != base[i][t]) == (t == k), (i, t, moved[i][t], base[i][t])
    assert moved[0][k] > base[0][k]  # the rewarded episode's turn k gains, the others at turn k lose
    for (a, b), adv in zip(TURNS, moved[0]):  # every token of a turn carries its turn's advantage
        assert np.all(np.asarray(samples[0].advantage)[a:b] == np.float32(adv))


def test_with_no_step_rewards_turn_mode_gives_every_turn_the_episode_advantage():
    episode_cfg, turn_cfg = cfg_with(), cfg_with("training.advantage=turn", *TURN_HARNESS)
    eps = [Episode("g", record([0, 0, 0]), 0, o, 6) for o in (1.0, 0.0, 0.5)]
    _, episode_tokens, _ = per_token(episode_cfg, eps)
    _, turn_tokens, row = per_token(turn_cfg, eps)
    assert torch.equal(episode_tokens, turn_tokens)
    assert row[keys.ADVANTAGE_TURN_SPREAD] == 0.0 and row[keys.ADVANTAGE_STEP_SHARE] == 0.0


@pytest.mark.parametrize("gamma", [0.5, 0.9])
def test_a_discount_moves_earlier_turns_by_gamma_to_the_distance(gamma):
    cfg = cfg_with("training.advantage=turn", f"training.turn_discount={gamma}", "training.advantage_std_scale=false", *TURN_HARNESS)
    base, _, _ = turn_advantages(cfg, [[0, 0, 0]] * 3)
    moved, _, _ = turn_advantages(cfg, [[0, 0, 1.0], [0, 0, 0], [0, 0, 0]])
    delta = [m - b for m, b in zip(moved[0], base[0])]
    assert delta[2] == pytest.approx(1.0 - 1.0 / 3)  # mean-centred within the group of three
    assert delta[1] == pytest.approx(gamma * delta[2]) and delta[0] == pytest.approx(gamma ** 2 * delta[2])


def test_step_returns_are_discounted_sums_to_go():
    assert step_returns([1.0, 0.0, 2.0], 0.0) == [1.0, 0.0, 2.0]
    assert step_returns([1.0, 0.0, 2.0], 0.5) == [1.5, 1.0, 2.0]


def test_a_turn_baseline_leaves_out_the_episodes_that_did_not_reach_it():
    cfg = cfg_with("training.advantage=turn", "training.advantage_std_scale=false", *TURN_HARNESS)
    short = [0, 0, 1, 1, 0, 1]  # two turns
    eps = [Episode("g", record([0, 0, 3.0]), 0, 0.0, 6), Episode("g", record([0, 0, 1.0]), 0, 0.0, 6),
           Episode("g", record([0, 0], mask=short), 0, 0.0, 6)]
    samples, _ = SampleBuilder(cfg)([eps], 0)
    assert float(np.asarray(samples[0].advantage)[10]) == pytest.approx(1.0)  # 3 - mean(3, 1): the short one is not in it
    assert float(np.asarray(samples[1].advantage)[10]) == pytest.approx(-1.0)
    assert np.all(np.asarray(samples[2].advantage) == 0.0)


def test_turns_are_the_runs_of_loss_mask_ones_across_segments():
    assert turn_spans(MASK) == TURNS and turn_spans([0, 0]) == []
    cfg = cfg_with("training.advantage=turn", *TURN_HARNESS)
    eps = [Episode("g", record([0, 1.0, 0], segments=[0, 5]), 0, 0.5, 6), Episode("g", record([0, 0, 0]), 0, 0.5, 6)]
    samples, _ = SampleBuilder(cfg)([eps], 0)
    first, second = np.asarray(samples[0].advantage), np.asarray(samples[1].advantage)
    assert len(first) == 5 and len(second) == 6  # the record's array cut like its segments
    assert first[2] == 0.0 and second[0] > 0 and second[4] == 0.0  # turn 1 (tokens 5-7) sits in the second segment


def test_a_role_record_counts_its_own_turns_only():
    cfg = cfg_with("training.advantage=turn", *TURN_HARNESS)
    mask = [0, 1, 1, 0, 0, 1]  # the guesser's two turns of a four-step joint episode
    roles = ["guesser", "holder", "guesser", "holder"]
    eps = [Episode("g", record([0, 5.0, 1.0, 5.0], mask=mask, role="guesser", step_roles=roles), 0, 0.5, 6),
           Episode("g", record([0, 5.0, 0, 5.0], mask=mask, role="guesser", step_roles=roles), 0, 0.5, 6)]
    samples, row = SampleBuilder(cfg)([eps], 0)
    adv = np.asarray(samples[0].advantage)
    assert adv[1] == 0.0 and adv[5] > 0 and row[keys.ROLLOUT_TURN_UNMAPPED] == 0


def test_an_episode_whose_turns_cannot_be_located_trains_on_its_outcome_and_is_counted():
    cfg = cfg_with("training.advantage=turn", *TURN_HARNESS)
    eps = [Episode("g", record([0, 1.0]), 0, 1.0, 6), Episode("g", record([0, 0, 0]), 0, 0.0, 6)]  # two steps, three runs
    samples, row = SampleBuilder(cfg)([eps], 0)
    assert len(set(np.asarray(samples[0].advantage).tolist())) == 1 and row[keys.ROLLOUT_TURN_UNMAPPED] == 1


def test_turn_mode_row_carries_the_spread_and_the_step_share():
    cfg = cfg_with("training.advantage=turn", *TURN_HARNESS)
    _, _, row = turn_advantages(cfg, [[0, 1.0, 0], [0, 0, 0], [0, 0, 0]])
    assert row[keys.ADVANTAGE_TURN_SPREAD] > 0 and 0 < row[keys.ADVANTAGE_STEP_SHARE] < 1
    assert row[keys.ROLLOUT_TURN_UNMAPPED] == 0


def test_per_token_advantages_weigh_each_token_in_the_loss():
    lp = torch.zeros(2, 4)
    mask = torch.tensor([[0, 1, 1, 1], [0, 1, 1, 0]], dtype=torch.float32)
    samples = [Sample([1, 2, 3, 4], [0, 1, 1, 1], [0.0] * 4, np.array([0, 1.0, -1.0, 2.0], dtype=np.float32)),
               Sample([1, 2, 3], [0, 1, 1], [0.0] * 3, 0.5)]
    b = collate(samples, 0)
    assert b.advantages.tolist() == [[0.0, 1.0, -1.0, 2.0], [0.5, 0.5, 0.5, 0.0]]
    loss, _ = ppo_clip_loss(lp, lp, b.advantages, mask, 0.2)
    assert loss.item() == pytest.approx(-(1.0 - 1.0 + 2.0 + 0.5 + 0.5) / 5)


def test_turn_credit_with_a_harness_without_step_rewards_is_refused_at_load():
    with pytest.raises(ConfigError) as exc:
        cfg_with("training.advantage=turn", "harnesses=" + '[{"name": "terminal_like"}]')
    assert "terminal_like" in exc.value.message and "step_rewards" in exc.value.message
    assert "training.advantage: episode" in exc.value.hint


def test_turn_credit_refusal_exits_2_through_the_cli(cli):
    res = cli("config", "validate", "--set", "training.advantage=turn", "--set", 'harnesses=[{"name": "terminal_like"}]')
    assert res.exit_code == 2 and "terminal_like" in res.output and "step_rewards" in res.output
    assert cli("config", "validate", "--set", "training.advantage=turn", "--set", 'harnesses=[{"name": "openenv"}]').exit_code == 0


def test_dynamic_sampling_keeps_a_group_flat_in_outcome_whose_turns_differ_only_in_turn_mode():
    from agentrl_cli.run.loop.shaping import Shaping

    flat_outcome = [Episode("g", record([0, 1.0, 0]), 0, 1.0, 6), Episode("g", record([0, 0, 0]), 0, 1.0, 6)]
    assert Shaping(cfg_with("training.advantage=turn", *TURN_HARNESS).training).group_has_signal(flat_outcome)
    assert not Shaping(cfg_with().training).group_has_signal(flat_outcome)
    flat_turns = [Episode("g", record([0, 1.0, 0]), 0, 1.0, 6), Episode("g", record([0, 1.0, 0]), 0, 1.0, 6)]
    assert not Shaping(cfg_with("training.advantage=turn", *TURN_HARNESS).training).group_has_signal(flat_turns)


def test_per_token_samples_cross_to_the_trainer_ranks_and_collate_with_their_blank_padding():
    import pickle

    from agentrl_cli.learner.rank_worker import shard

    samples = [Sample([1, 2, 3], [0, 1, 1], [0.0] * 3, np.array([0.0, 1.0, -2.0], dtype=np.float32)) for _ in range(3)]
    mine, real = shard(pickle.loads(pickle.dumps(samples)), rank=1, world_size=2)
    b = collate(mine, 0)
    assert real == 1 and b.advantages.tolist() == [[0.0, 1.0, -2.0], [0.0, 0.0, 0.0]] and b.loss_mask[1].sum() == 0
