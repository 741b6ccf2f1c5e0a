"""The asynchronous rollout: task sampler, episode runner, bounded buffer with staleness control,
and the controller that keeps many episodes in flight."""
