"""Stage 5 - sandbox and harnesses.

Planned checks: create/exec/reclaim under concurrency with no leftovers; timeouts end the process with a timeout observation; clean reset; limits hold; egress denied.
Not built yet: the stage reports one failing "not implemented" check, never pass or skip.
"""

from agentrl_cli.context import StageContext
from agentrl_cli.report import Check, StageReport

PLANNED = (
    "create/exec/reclaim under concurrency with no leftovers; timeouts end the process with a timeout observation; clean reset; limits hold; egress denied"
)


def run(ctx: StageContext) -> StageReport:
    return ctx.report([Check.not_implemented(PLANNED)])
