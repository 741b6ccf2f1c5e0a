"""Stage 3 - control plane.

Planned checks: state store reachable and writable; one leader among two instances and failover; a no-op job lands in the named pool; priority order and quota refusal.
Not built yet: the stage reports one failing "not implemented" check, never pass or skip.
"""

from agentrl_cli.context import StageContext
from agentrl_cli.report import Check, StageReport

PLANNED = (
    "state store reachable and writable; one leader among two instances and failover; a no-op job lands in the named pool; priority order and quota refusal"
)


def run(ctx: StageContext) -> StageReport:
    return ctx.report([Check.not_implemented(PLANNED)])
