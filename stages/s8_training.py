"""Stage 8 - training.

Planned checks: smoke (finite loss, non-degenerate reward, checkpoint written, reloaded and resumed), short (reward rises, entropy stable, gradient norm stable), full (the configured run with periodic checkpoints and resume).
Not built yet: the stage reports one failing "not implemented" check, never pass or skip.
"""

from agentrl_cli.context import StageContext
from agentrl_cli.report import Check, StageReport

PLANNED = (
    "smoke (finite loss, non-degenerate reward, checkpoint written, reloaded and resumed), short (reward rises, entropy stable, gradient norm stable), full (the configured run with periodic checkpoints and resume)"
)


def run(ctx: StageContext) -> StageReport:
    return ctx.report([Check.not_implemented(PLANNED)])
