"""`disk`: the trainer exports an ordinary model directory (safetensors) per version and every
server loads it with `update_weights_from_disk`; the newest `keep` exports stay on disk, so a
restarted server can load the current one alone."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

from agentrl_cli.weightsync.base import Prepared, Published
from agentrl_cli.weightsync.servers import load_from_disk

if TYPE_CHECKING:
    from agentrl_cli.learner.backend import TrainingBackend


async def export_version(root: Path, version: int, export, rank: int) -> Prepared:
    """`export(dir)` (a backend's export_weights or export_adapter) into a fresh `root`/v<version>."""
    path = root / f"v{version:06d}"
    if path.exists():
        shutil.rmtree(path)
    await asyncio.to_thread(export, path)
    return Prepared(version=version, payload=path, rank=rank)


class DiskTransport:
    name = "disk"
    hint = "and the export path"

    def __init__(self, client, export_root: Path, *, keep: int = 2) -> None:
        self.client, self.root, self.keep = client, Path(export_root), keep

    @classmethod
    def from_config(cls, cfg, client, workdir: Path) -> "DiskTransport":
        return cls(client, Path(workdir) / "weights")

    async def prepare(self, backend: TrainingBackend, version: int) -> Prepared:
        return await export_version(self.root, version, backend.export_weights, backend.rank)

    async def publish(self, prepared: Prepared) -> Published:
        t0 = time.perf_counter()
        await self.client.update_weights_from_disk(str(prepared.payload), str(prepared.version))
        self._prune(prepared.version)
        return Published(prepared.version, self.name, path=str(prepared.payload),
                         timings={"load_s": time.perf_counter() - t0})

    async def resend(self, urls: list[str], last: Published) -> bool:
        await load_from_disk(urls, last.path, str(last.version), headers=self.client.headers,
                             engine=getattr(self.client, "engine", None))
        return True

    async def close(self) -> None:
        """Nothing to release: the exports stay for a resume."""

    def _prune(self, version: int) -> None:
        exports = sorted(self.root.glob("v*"))
        for old in exports[: max(0, len(exports) - self.keep)]:
            if old.name != f"v{version:06d}":
                shutil.rmtree(old, ignore_errors=True)
