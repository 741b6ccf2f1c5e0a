"""From the groups the trainer took off the buffer to GRPO samples: rewards normalized
(`reward.normalization`), group advantages, masked episodes (no reward) left out, and the step's
reward and staleness statistics."""

from __future__ import annotations

import statistics

from agentrl_cli.observe import keys
from agentrl_cli.outcomes import Outcome
from agentrl_cli.reward.aggregate import RewardNormalizer
from agentrl_cli.training.grpo import Sample, group_advantages


class SampleBuilder:
    def __init__(self, cfg) -> None:
        self.normalizer = RewardNormalizer(cfg.reward.normalization, cfg.reward.window_size)
        self.std_scale = cfg.training.advantage_std_scale

    def __call__(self, groups, version: int) -> tuple[list[Sample], dict]:
        eps = [e for g in groups for e in g]
        normalized = self.normalizer.apply([e.reward for e in eps], [e.group_id for e in eps])
        adv = group_advantages(normalized, [e.group_id for e in eps], scale=self.std_scale)
        samples = [Sample(token_ids=e.record.token_ids, loss_mask=e.record.loss_mask, logprobs=e.record.logprobs, advantage=a)
                   for e, a in zip(eps, adv) if e.reward is not None]
        rewards = [e.reward for e in eps if e.reward is not None]
        stats = {keys.REWARD_MEAN: statistics.fmean(rewards) if rewards else None,
                 keys.REWARD_STD: statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
                 keys.REWARD_SUCCESS_RATE: sum(e.record.outcome == Outcome.SUCCESS for e in eps) / len(eps) if eps else None,
                 keys.REWARD_MASKED: sum(e.reward is None for e in eps),
                 keys.ROLLOUT_STALENESS_MEAN: statistics.fmean(version - e.version for e in eps) if eps else None,
                 keys.TOKENS_TRAINED: sum(e.tokens for e in eps)}
        return samples, stats
