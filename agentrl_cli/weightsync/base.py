"""The weight-transport seam: how a trainer's weights reach the inference servers.

A transport moves weights and nothing else; when and to whom they go, the lock, the overlap with
training, the read-back check and the re-sync of restarted servers belong to `publisher.py`.

    class WeightTransport(Protocol):
        name: str
        async def prepare(self, backend, version: int) -> Prepared     # read the trainer's weights
        async def publish(self, prepared: Prepared) -> Published       # every server loads them
        async def resend(self, urls: list[str], last: Published) -> bool  # reload `last` on these servers alone
        async def close(self) -> None                                  # release groups, files

`prepare` is called by every trainer rank with the trainer stopped; it returns as soon as the
weights are read (an export written, copies taken), so the trainer may step again while `publish`
runs. `publish` is called once per prepared version, in order, never two at once. `resend` returns
False when the transport cannot reload one server alone (the publisher then syncs every server in
full at the next step). A transport raises `WeightSyncError` with a hint on failure; the publisher
counts it and syncs again.

What does not belong here: any one transport (`disk.py`, `distributed.py`), the process group
(`group.py`), the schedule (`publisher.py`), which transport a config names (`registry.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from agentrl_cli.core.errors import AgentrlError

if TYPE_CHECKING:
    from agentrl_cli.learner.backend import TrainingBackend


class WeightSyncError(AgentrlError):
    exit_code = 1


@dataclass
class Prepared:
    """One version's weights, read off the trainer and ready to publish."""

    version: int
    payload: Any = None  # the transport's own: an export directory, copies of the tensors
    rank: int = 0  # the trainer rank that prepared it (only rank 0 talks to the servers)
    read_s: float = 0.0  # seconds the trainer spent handing its weights over
    reference: dict[str, list[float]] = field(default_factory=dict)  # filled by the publisher: values to verify


@dataclass
class Published:
    """What a publish did; `as_entry()` is the history row a run records."""

    version: int
    transport: str
    path: str | None = None  # a directory a server can load these weights from alone (None: not on disk)
    seconds: float = 0.0  # on the publishing path: read + load + verify
    verified_tensors: int = 0
    verified_versions: int = 0  # servers that report the published version (where no parameter can be read back)
    timings: dict[str, float] = field(default_factory=dict)  # export_s, init_s, load_s, verify_s
    details: dict[str, Any] = field(default_factory=dict)  # group, backend, tensors, bytes

    def as_entry(self) -> dict:
        entry: dict[str, Any] = {"version": self.version, "transport": self.transport}
        if self.path is not None:
            entry["path"] = self.path
        entry.update(self.details)
        entry.update({k: round(v, 3) for k, v in self.timings.items()})
        entry.update(verified_tensors=self.verified_tensors, seconds=round(self.seconds, 3))
        if self.verified_versions:
            entry["verified_versions"] = self.verified_versions
        return entry

    @staticmethod
    def verified(entry: dict) -> bool:
        """Whether a history row's publish was checked on the servers: tensors read back, or, where the
        engine cannot read a parameter back (vLLM), every server reporting the published version."""
        return entry.get("verified_tensors", 0) > 0 or entry.get("verified_versions", 0) > 0


@runtime_checkable
class WeightTransport(Protocol):
    name: str

    async def prepare(self, backend: TrainingBackend, version: int) -> Prepared: ...
    async def publish(self, prepared: Prepared) -> Published: ...
    async def resend(self, urls: list[str], last: Published) -> bool: ...
    async def close(self) -> None: ...
