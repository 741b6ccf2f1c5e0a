"""Stage 1 - network and storage.

Planned checks: all-reduce bus bandwidth across ranks; checkpoint dir write bandwidth and small-file rate; object store bucket/prefix create, put, list, get, delete; sandbox cannot reach a host loopback listener and has no non-loopback interface.
Not built yet: the stage reports one failing "not implemented" check, never pass or skip.
"""

from agentrl_cli.context import StageContext
from agentrl_cli.report import Check, StageReport

PLANNED = (
    "all-reduce bus bandwidth across ranks; checkpoint dir write bandwidth and small-file rate; object store bucket/prefix create, put, list, get, delete; sandbox cannot reach a host loopback listener and has no non-loopback interface"
)


def run(ctx: StageContext) -> StageReport:
    return ctx.report([Check.not_implemented(PLANNED)])
