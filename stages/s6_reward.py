"""Stage 6 - reward.

Planned checks: same input twice gives the same result; bad input gives an explicit error, never a high score; idempotency key returns the cached result; throughput.
Not built yet: the stage reports one failing "not implemented" check, never pass or skip.
"""

from agentrl_cli.context import StageContext
from agentrl_cli.report import Check, StageReport

PLANNED = (
    "same input twice gives the same result; bad input gives an explicit error, never a high score; idempotency key returns the cached result; throughput"
)


def run(ctx: StageContext) -> StageReport:
    return ctx.report([Check.not_implemented(PLANNED)])
