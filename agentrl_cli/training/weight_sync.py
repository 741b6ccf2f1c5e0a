"""Weight sync from the trainer to the inference servers, verified.

`DiskWeightSync`: the trainer exports an ordinary model directory (safetensors), every server loads
it with `update_weights_from_disk` and reports the new `weight_version`; then sampled tensors are
read back with `get_weights_by_name` and compared with the trainer's, and a mismatch fails loudly
(`WeightSyncError`) instead of letting the rollout sample from weights nobody trained.
The `distributed` transport (`init_weights_update_group` + `update_weights_from_distributed`) is
not built yet: asking for it raises with that message.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

from agentrl_cli.errors import AgentrlError

VERIFY_NAMES = ("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", "lm_head.weight")


class WeightSyncError(AgentrlError):
    exit_code = 1


class DiskWeightSync:
    def __init__(self, client, export_root: Path, *, keep: int = 2, verify_names: tuple[str, ...] = VERIFY_NAMES,
                 sample: int = 16, tolerance: float = 1e-6) -> None:
        self.client, self.root, self.keep = client, Path(export_root), keep
        self.verify_names, self.sample, self.tolerance = verify_names, sample, tolerance
        self.history: list[dict] = []

    async def sync(self, backend, version: int) -> dict:
        t0 = time.perf_counter()
        path = self.root / f"v{version:06d}"
        if path.exists():
            shutil.rmtree(path)
        await asyncio.to_thread(backend.export_weights, path)
        exported = time.perf_counter()
        await self.client.update_weights_from_disk(str(path), str(version))
        loaded = time.perf_counter()
        checked = await self.verify(backend)
        self._prune(version)
        entry = {"version": version, "path": str(path), "export_s": round(exported - t0, 3),
                 "load_s": round(loaded - exported, 3), "verify_s": round(time.perf_counter() - loaded, 3),
                 "verified_tensors": checked, "seconds": round(time.perf_counter() - t0, 3)}
        self.history.append(entry)
        return entry

    async def verify(self, backend) -> int:
        """Compare the first values of a few parameters on every server with the trainer's."""
        names = [n for n in self.verify_names if n in dict(backend.parameter_names())] or list(dict(backend.parameter_names()))[:1]
        ours = backend.named_parameter_sample(names, self.sample)
        for name in names:
            for url, rows in (await self.client.get_weights_by_name(name, 1)).items():
                theirs = _flatten(rows)[: self.sample]
                mine = ours[name][: len(theirs)]
                worst = max((abs(a - b) for a, b in zip(mine, theirs)), default=float("inf"))
                if not theirs or worst > self.tolerance:
                    raise WeightSyncError(f"weights on {url} differ from the trainer's after sync ({name}: max diff {worst:.3g})",
                                          "the server did not load the exported weights; check its log and the export path")
        return len(names)

    def _prune(self, version: int) -> None:
        exports = sorted(self.root.glob("v*"))
        for old in exports[: max(0, len(exports) - self.keep)]:
            if old.name != f"v{version:06d}":
                shutil.rmtree(old, ignore_errors=True)


def _flatten(rows) -> list[float]:
    out: list[float] = []
    stack = [rows]
    while stack:
        x = stack.pop()
        if isinstance(x, list):
            stack.extend(reversed(x))
        else:
            out.append(float(x))
    return out


def make_weight_sync(transport: str, client, export_root: Path):
    if transport == "disk":
        return DiskWeightSync(client, export_root)
    raise WeightSyncError(f"training.weight_sync: {transport!r} is not built yet in this version",
                          "set training.weight_sync: disk")
