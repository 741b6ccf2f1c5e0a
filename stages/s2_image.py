"""Stage 2 - image and runtime.

Planned checks: version lock; Dockerfiles rendered from templates; the running environment matches the lock; torch/CUDA/NCCL/DeepSpeed/SGLang present where each role needs them; probe build with docker, podman or buildah when one is present.
Not built yet: the stage reports one failing "not implemented" check, never pass or skip.
"""

from agentrl_cli.context import StageContext
from agentrl_cli.report import Check, StageReport

PLANNED = (
    "version lock; Dockerfiles rendered from templates; the running environment matches the lock; torch/CUDA/NCCL/DeepSpeed/SGLang present where each role needs them; probe build with docker, podman or buildah when one is present"
)


def run(ctx: StageContext) -> StageReport:
    return ctx.report([Check.not_implemented(PLANNED)])
