"""Stage 4 - inference.

Planned checks: server starts and is healthy; tokens/s and p99 latency under concurrent load; no out-of-memory; log-probs consistent with a forward pass; weight update round trip changes outputs and reports the new version.
Not built yet: the stage reports one failing "not implemented" check, never pass or skip.
"""

from agentrl_cli.context import StageContext
from agentrl_cli.report import Check, StageReport

PLANNED = (
    "server starts and is healthy; tokens/s and p99 latency under concurrent load; no out-of-memory; log-probs consistent with a forward pass; weight update round trip changes outputs and reports the new version"
)


def run(ctx: StageContext) -> StageReport:
    return ctx.report([Check.not_implemented(PLANNED)])
