"""Stage 0 - baseline.

Planned checks: smallest model and a few tasks through the whole loop once (rollout -> reward -> train step -> weight sync); time shares of sampling, training and sync; tokens/s; env step latency; baseline.json.
Not built yet: the stage reports one failing "not implemented" check, never pass or skip.
"""

from agentrl_cli.context import StageContext
from agentrl_cli.report import Check, StageReport

PLANNED = (
    "smallest model and a few tasks through the whole loop once (rollout -> reward -> train step -> weight sync); time shares of sampling, training and sync; tokens/s; env step latency; baseline.json"
)


def run(ctx: StageContext) -> StageReport:
    return ctx.report([Check.not_implemented(PLANNED)])
