"""Stage 7 - data.

Planned checks: write, partition, schema validation, compression ratio, redaction, query by filter, retention, replay without divergence.
Not built yet: the stage reports one failing "not implemented" check, never pass or skip.
"""

from agentrl_cli.context import StageContext
from agentrl_cli.report import Check, StageReport

PLANNED = (
    "write, partition, schema validation, compression ratio, redaction, query by filter, retention, replay without divergence"
)


def run(ctx: StageContext) -> StageReport:
    return ctx.report([Check.not_implemented(PLANNED)])
