"""From the groups the trainer took off the buffer to GRPO samples: rewards normalized
(`reward.normalization`), group advantages, masked episodes (no reward) left out, and the step's
reward and staleness statistics.

An episode is one sample, or one per segment when its record has `segment_starts` (an agent that
rewrote its history through the gateway: each segment a token-exact sequence of its own); the
segments share the episode's advantage. The row counts both: `rollout/episodes_trained` and
`rollout/samples_built` (more samples than episodes: episodes trained per segment).

`training.advantage`: `episode` (the default) gives every sample its episode's advantage, a float;
`turn` gives every sample a per-token array, each model turn's tokens its turn's advantage
(`learner/turn_credit.py` has the formula), and adds the per-turn metrics to the row.

The reward each episode counts with and whether it trains are `run/loop/shaping.py`'s (the soft
overlong penalty, overlong filtering); its `rollout.truncation` is the controller's."""

from __future__ import annotations

import statistics

import numpy as np

from agentrl_cli.run.loop.shaping import Shaping, own_step_rewards
from agentrl_cli.runtime.observe import keys
from agentrl_cli.core.outcomes import Outcome
from agentrl_cli.runtime.reward.aggregate import RewardNormalizer
from agentrl_cli.learner.grpo import Sample, group_advantages
from agentrl_cli.learner import turn_credit


def segments(record) -> list[tuple[int, int]]:
    """(start, end) of each training sample of a stored record in its token ids (one: the whole)."""
    n = len(record.token_ids)
    starts = [int(s) for s in (record.segment_starts if record.segment_starts is not None else ()) if 0 <= int(s) < n]
    starts = sorted(set(starts) | {0}) if n else [0]
    return [(a, b) for a, b in zip(starts, starts[1:] + [n]) if b > a] or [(0, n)]


def episode_samples(record, advantage, staleness: int | None = None) -> list[Sample]:
    """The samples of one episode: one per segment, each with the episode's advantage (a float, or
    a per-token array over the whole record, cut like the tokens) and its policy lag (`staleness`:
    trainer versions since the oldest weights it was generated with)."""
    ids, mask, lps = record.token_ids, record.loss_mask, record.logprobs
    per_token = isinstance(advantage, np.ndarray)
    return [Sample(token_ids=ids[a:b], loss_mask=mask[a:b], logprobs=lps[a:b],
                   advantage=advantage[a:b] if per_token else advantage, staleness=staleness)
            for a, b in segments(record)]


def role_stats(eps, shaped) -> dict:
    """Per role of a multi-agent harness (episodes whose record has a `role`): its reward mean, success
    rate and episode count in the batch (`keys.reward_role`)."""
    by_role: dict[str, list] = {}
    for e, r in zip(eps, shaped):
        role = getattr(e.record, "role", None)
        if role:
            by_role.setdefault(role, []).append((e, r))
    stats = {}
    for role, pairs in sorted(by_role.items()):
        rewards = [r for _, r in pairs if r is not None]
        stats[keys.reward_role(role)] = statistics.fmean(rewards) if rewards else None
        stats[keys.reward_role(role, "success_rate")] = sum(e.record.outcome == Outcome.SUCCESS for e, _ in pairs) / len(pairs)
        stats[keys.reward_role(role, "episodes")] = len(pairs)
    return stats


class SampleBuilder:
    def __init__(self, cfg) -> None:
        self.normalizer = RewardNormalizer(cfg.reward.normalization, cfg.reward.window_size)
        self.std_scale = cfg.training.advantage_std_scale
        self.shaping = Shaping(cfg.training)
        self.filtering = cfg.training.overlong_filter
        self.per_turn = cfg.training.advantage == "turn"
        self.gamma = cfg.training.turn_discount

    def __call__(self, groups, version: int) -> tuple[list[Sample], dict]:
        eps = [e for g in groups for e in g]
        shaped = [self.shaping.reward(e) for e in eps]
        normalized = self.normalizer.apply(shaped, [e.group_id for e in eps])
        adv = group_advantages(normalized, [e.group_id for e in eps], scale=self.std_scale)
        credit = {}
        if self.per_turn:
            adv, credit = self.turn_advantages(eps, normalized, adv)
        trained = [(e, a) for e, a in zip(eps, adv) if self.shaping.trains(e)]
        samples = [s for e, a in trained for s in episode_samples(e.record, a, version - e.version)]
        rewards = [r for r in shaped if r is not None]
        stats = {keys.REWARD_MEAN: statistics.fmean(rewards) if rewards else None,
                 keys.REWARD_STD: statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
                 keys.REWARD_SUCCESS_RATE: sum(e.record.outcome == Outcome.SUCCESS for e in eps) / len(eps) if eps else None,
                 keys.REWARD_MASKED: sum(e.reward is None for e in eps),
                 keys.ROLLOUT_STALENESS_MEAN: statistics.fmean(version - e.version for e in eps) if eps else None,
                 keys.TOKENS_TRAINED: sum(e.tokens for e in eps),
                 keys.ROLLOUT_EPISODES_TRAINED: len(trained), keys.ROLLOUT_SAMPLES_BUILT: len(samples)}
        stats.update(role_stats(eps, shaped))
        stats.update(credit)
        if self.filtering:
            stats[keys.ROLLOUT_OVERLONG_FILTERED] = sum(e.reward is not None and not self.shaping.trains(e) for e in eps)
        return samples, stats

    def turn_advantages(self, eps, normalized, outcome: list[float]) -> tuple[list, dict]:
        """`training.advantage: turn`: each episode's per-token advantages (its outcome advantage plus
        its turns' step advantages; the outcome alone for an episode whose turns cannot be located in
        its tokens) and the row's per-turn metrics over the trained episodes."""
        returns = [None if r is None else turn_credit.step_returns(own_step_rewards(e.record), self.gamma)
                   for e, r in zip(eps, normalized)]
        keys_ = [f"{e.group_id}\x00{getattr(e.record, 'role', None) or ''}" for e in eps]
        step = turn_credit.turn_step_advantages(returns, keys_, scale=self.std_scale)
        per_token, unmapped, out_t, step_t = [], 0, [], []
        for e, o, s in zip(eps, outcome, step):
            tokens = turn_credit.token_advantages(e.record.loss_mask, o, s)
            if self.shaping.trains(e):
                unmapped += tokens is None
                if tokens is not None:
                    out_t.append(o)
                    step_t.append(s)
            per_token.append(tokens if tokens is not None else np.full(len(e.record.loss_mask), o, dtype=np.float32))
        spread, share = turn_credit.credit_stats(out_t, step_t)
        return per_token, {keys.ADVANTAGE_TURN_SPREAD: spread, keys.ADVANTAGE_STEP_SHARE: share,
                           keys.ROLLOUT_TURN_UNMAPPED: unmapped}
