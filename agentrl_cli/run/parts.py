"""What one training run is made of (`RunParts`) and what changes while it trains (`RunState`).

`RunParts` is frozen: `build.PartsBuilder` makes it whole in one place when the run starts, and
`build.close_parts` closes it; the step loop (`loop/`), the checkpoint schedule and the supervision
(`supervise/wiring.py`) take it with the `RunState` and the config sections they read, never the
run object. `RunState` is the little that the loop, a resume and a restart change: step, weight
version, trained tokens, the ledger of trained draws, the checkpoint resumed from, the restarts
before this attempt, and the records of this attempt (its step rows, evaluations and checkpoints).

`View` lets `TrainingRun` keep its old attributes (`run.client`, `run.step`, ...): each reads the
parts or the state; a state's attribute can be set, a part's cannot (parts are replaced only whole).

Belongs here: the two records and the view over them. Not here: building or closing the parts
(`build.py`), what the loop does with them (`loop/steps.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentrl_cli.engines.inference.client import InferenceClient
    from agentrl_cli.envs.sandbox.provider import HarnessSandboxes
    from agentrl_cli.learner.backend import TrainingBackend
    from agentrl_cli.learner.checkpoint import CheckpointManager
    from agentrl_cli.run.loop.samples import SampleBuilder
    from agentrl_cli.runtime.data.writer import TrajectoryWriter
    from agentrl_cli.runtime.observe.step_metrics import MetricsLog
    from agentrl_cli.runtime.observe.watchdog import Watchdog
    from agentrl_cli.runtime.rollout.agent_gateway import AgentGateway
    from agentrl_cli.runtime.rollout.buffer import TrajectoryBuffer
    from agentrl_cli.runtime.rollout.controller import RolloutController
    from agentrl_cli.runtime.rollout.sampler import TaskSampler
    from agentrl_cli.weightsync.publisher import WeightPublisher


@dataclass(frozen=True)
class RunParts:
    """The parts of one run. A part is None when this run has none (no trainer: `backend`,
    `publisher`; no harness that needs the gateway: `gateway`), or, after a start that failed
    halfway, when it was not built yet (`close_parts` closes what there is)."""

    run_id: str = ""
    phase: str = ""
    run_dir: Path = Path(".")
    model_path: Path = Path(".")
    metrics: MetricsLog | None = None  # metrics.jsonl and its exporters: open from the run's creation
    watchdog: Watchdog | None = None
    checkpoints: CheckpointManager | None = None  # <run_dir>/checkpoints: readable before the start (restarts)
    samples: SampleBuilder | None = None  # groups into GRPO samples; keeps the reward normalizer's window
    servers: tuple = ()  # the inference servers this run started or took over (launcher.ServerProcess)
    kept: object = None  # kept_servers.KeptServers: where the run takes its servers from and hands them to (None: its own)
    client: InferenceClient | None = None
    sampler: TaskSampler | None = None
    buffer: TrajectoryBuffer | None = None
    writer: TrajectoryWriter | None = None
    gateway: AgentGateway | None = None
    sandboxes: HarnessSandboxes | None = None
    controller: RolloutController | None = None
    backend: TrainingBackend | None = None
    publisher: WeightPublisher | None = None


@dataclass
class RunState:
    """What changes as the run trains; a checkpoint keeps step, version and ledger, a resume restores them."""

    step: int = 0
    version: int = 0  # the policy's weight version (rollout.weight_sync_interval_steps steps each)
    trained_tokens: int = 0
    ledger: list[dict] = field(default_factory=list)  # per trained step, the draws it trained on (loop/ledger.py)
    resumed_from: str | None = None  # the checkpoint this attempt resumed from
    restarts: int = 0  # trainer restarts before this attempt (`supervised`)
    step_rows: list[dict] = field(default_factory=list)  # this attempt's step rows, whatever ends it
    evals: list[dict] = field(default_factory=list)  # and its evaluations
    checkpoints_written: list[str] = field(default_factory=list)  # names of the checkpoints it wrote


class View:
    """An attribute of an object that is the same-named field of its `holder` (`"parts"`, `"state"`)."""

    def __init__(self, holder: str, name: str | None = None, *, writable: bool = False) -> None:
        self.holder, self.name, self.writable = holder, name, writable

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = self.name or name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        return self if obj is None else getattr(getattr(obj, self.holder), self.name)

    def __set__(self, obj: Any, value: Any) -> None:
        if not self.writable:
            raise AttributeError(f"{self.name} is a part of the run, built whole when it starts (run/parts.py)")
        setattr(getattr(obj, self.holder), self.name, value)


def views(holder: str, count: int, *, writable: bool = False) -> tuple[View, ...]:
    """`count` views of `holder`'s fields, one per name they are bound to (`a, b = views("state", 2)`)."""
    return tuple(View(holder, writable=writable) for _ in range(count))
