"""The reward: verifiers, process rewards, aggregation, the idempotent scorer, the HTTP service and
its clients (in-process and HTTP behind one interface)."""

from agentrl_cli.runtime.reward.models import RewardResult, ScoreRequest
from agentrl_cli.runtime.reward.scorer import Scorer

__all__ = ["RewardResult", "ScoreRequest", "Scorer"]
