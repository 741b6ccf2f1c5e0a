"""Weight sync from the trainer to the inference servers, verified. Two transports, one contract:
`await sync(backend, version) -> dict` (also appended to `history`), `await close()`.

Each sync is `prepare` (reads the trainer's weights: export or copies, and the values to verify
against) then `publish` (the servers load them, the read-back is checked); the trainer may step
again between the two, so a run can publish while it trains (`TrainingRun`, async mode).

`DiskWeightSync` (`disk`): the trainer exports an ordinary model directory (safetensors), every
server loads it with `update_weights_from_disk` and reports the new `weight_version`.

`DistributedWeightSync` (`distributed`): the trainer (rank 0) and every server (ranks 1..N) join a
weight-update process group once (`init_weights_update_group`, gloo on CPU, NCCL on GPUs); each sync
broadcasts every parameter while the servers receive them (`update_weights_from_distributed`).
No file is written. It needs each server's own URL (not a router's).

Either way, sampled tensors are then read back with `get_weights_by_name` and compared with the
trainer's, and a mismatch fails loudly (`WeightSyncError`) instead of letting the rollout sample
from weights nobody trained. The process group itself lives in `inference/weight_group.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import threading
import time
from pathlib import Path

from agentrl_cli.errors import AgentrlError
from agentrl_cli.inference.weight_group import (DEFAULT_GROUP, DEFAULT_TIMEOUT_S, default_backend, dtype_name, listen,
                                                open_group)

VERIFY_NAMES = ("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", "lm_head.weight")


class WeightSyncError(AgentrlError):
    exit_code = 1


class VerifiedSync:
    """What both transports share: the client, the history, and the read-back check."""

    transport = ""
    hint = ""  # where to look when the read-back differs

    def __init__(self, client, *, verify_names: tuple[str, ...] = VERIFY_NAMES, sample: int = 16,
                 tolerance: float = 1e-6) -> None:
        self.client = client
        self.verify_names, self.sample, self.tolerance = verify_names, sample, tolerance
        self.history: list[dict] = []

    def reference(self, backend) -> dict[str, list[float]]:
        """The trainer's values that `verify` compares the servers' with (taken when the weights are
        exported, so the trainer may step again before the servers have loaded them)."""
        names = [n for n in self.verify_names if n in dict(backend.parameter_names())] or list(dict(backend.parameter_names()))[:1]
        return backend.named_parameter_sample(names, self.sample)

    async def sync(self, backend, version: int) -> dict:
        """Export, load on every server, verify; returns the history entry."""
        return await self.publish(await self.prepare(backend, version))

    async def verify(self, backend, ours: dict[str, list[float]] | None = None) -> int:
        """Compare the first values of a few parameters on every server with the trainer's (or with
        `ours`, from `reference`)."""
        ours = ours if ours is not None else self.reference(backend)
        names = list(ours)
        answers = await asyncio.gather(*(self.client.get_weights_by_name(name, 1) for name in names))  # all at once
        for name, answer in zip(names, answers):
            for url, rows in answer.items():
                theirs = _flatten(rows)[: self.sample]
                mine = ours[name][: len(theirs)]
                worst = max((abs(a - b) for a, b in zip(mine, theirs)), default=float("inf"))
                if not theirs or worst > self.tolerance:
                    raise WeightSyncError(f"weights on {url} differ from the trainer's after {self.transport} sync "
                                          f"({name}: max diff {worst:.3g})",
                                          f"the server did not load the trainer's weights; check its log ({self.hint})")
        return len(names)

    async def close(self) -> None:
        """Release what the transport holds (nothing for disk)."""


class DiskWeightSync(VerifiedSync):
    transport, hint = "disk", "and the export path"

    def __init__(self, client, export_root: Path, *, keep: int = 2, **verify) -> None:
        super().__init__(client, **verify)
        self.root, self.keep = Path(export_root), keep

    async def prepare(self, backend, version: int) -> dict:
        """The part that reads the trainer's weights: the export and the verification values. The
        trainer may step again once it returns; `publish` loads and verifies on the servers."""
        t0 = time.perf_counter()
        path = self.root / f"v{version:06d}"
        if path.exists():
            shutil.rmtree(path)
        await asyncio.to_thread(backend.export_weights, path)
        reference = await asyncio.to_thread(self.reference, backend)
        return {"version": version, "path": path, "reference": reference, "t0": t0, "exported": time.perf_counter()}

    async def publish(self, prepared: dict) -> dict:
        version, path, exported = prepared["version"], prepared["path"], prepared["exported"]
        t_load = time.perf_counter()
        await self.client.update_weights_from_disk(str(path), str(version))
        loaded = time.perf_counter()
        checked = await self.verify(None, prepared["reference"])
        self._prune(version)
        done = time.perf_counter()
        entry = {"version": version, "transport": self.transport, "path": str(path),
                 "export_s": round(exported - prepared["t0"], 3), "load_s": round(loaded - t_load, 3),
                 "verify_s": round(done - loaded, 3), "verified_tensors": checked,
                 "seconds": round(exported - prepared["t0"] + done - t_load, 3)}
        self.history.append(entry)
        return entry

    def _prune(self, version: int) -> None:
        exports = sorted(self.root.glob("v*"))
        for old in exports[: max(0, len(exports) - self.keep)]:
            if old.name != f"v{version:06d}":
                shutil.rmtree(old, ignore_errors=True)


class DistributedWeightSync(VerifiedSync):
    """Broadcast the trainer's parameters to the servers over a weight-update group, opened on the
    first sync and reused; `close()` leaves it. Every trainer rank calls `sync` (ZeRO-3 gathers the
    parameters); only rank 0 joins the group and talks to the servers. Server i takes ranks from
    1 + i * ranks_per_server (its tensor-parallel size for SGLang, 1 for the embedded server).
    After a failed transfer the group is dropped on both sides and the next sync opens a new one."""

    transport, hint = "distributed", "and that the group's backend suits both sides"

    def __init__(self, client, *, backend: str = "auto", group_name: str = DEFAULT_GROUP,
                 master_address: str = "127.0.0.1", ranks_per_server: int = 1, load_format: str | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, **verify) -> None:
        super().__init__(client, **verify)
        self.backend = default_backend() if backend == "auto" else backend
        self.group_name, self.master_address, self.ranks_per_server = group_name, master_address, ranks_per_server
        self.load_format, self.timeout_s = load_format, timeout_s
        self.group = None
        self.groups_opened = 0

    async def prepare(self, backend, version: int) -> dict:
        """Copies of the trainer's parameters (every rank; {} except on rank 0) and the verification
        values; the trainer may step again once it returns."""
        t0 = time.perf_counter()
        named = await asyncio.to_thread(backend.named_tensors)
        reference = await asyncio.to_thread(self.reference, backend)
        return {"version": version, "named": named, "rank": backend.rank, "reference": reference, "t0": t0,
                "gathered": time.perf_counter()}

    async def publish(self, prepared: dict) -> dict:
        version, named, gathered = prepared["version"], prepared["named"], prepared["gathered"]
        t_send = time.perf_counter()
        init_s, sent = 0.0, 0
        if prepared["rank"] == 0:
            if self.group is None:
                await self._open()
                init_s = time.perf_counter() - t_send
            sent = await self._send(named, version)
        loaded = time.perf_counter()
        checked = await self.verify(None, prepared["reference"])
        done = time.perf_counter()
        entry = {"version": version, "transport": self.transport, "group": self.group_name, "backend": self.backend,
                 "export_s": round(gathered - prepared["t0"], 3), "init_s": round(init_s, 3),
                 "load_s": round(loaded - t_send - init_s, 3), "verify_s": round(done - loaded, 3),
                 "tensors": len(named), "bytes": sent, "verified_tensors": checked,
                 "seconds": round(gathered - prepared["t0"] + done - t_send, 3)}
        self.history.append(entry)
        return entry

    async def _open(self) -> None:
        """Join as rank 0 while every server joins over HTTP: the rendezvous needs both at once."""
        world = 1 + len(self.client.urls) * self.ranks_per_server
        sock = listen(self.master_address, 0)
        port, cancelled = sock.getsockname()[1], threading.Event()
        joining = asyncio.ensure_future(asyncio.to_thread(
            open_group, self.master_address, port, 0, world, group_name=self.group_name, backend=self.backend,
            timeout_s=self.timeout_s, listener=sock, cancelled=cancelled))
        try:
            await self.client.init_weights_update_group(self.master_address, port, world, group_name=self.group_name,
                                                        backend=self.backend, ranks_per_server=self.ranks_per_server,
                                                        timeout_s=self.timeout_s + 30)
            self.group = await joining
        except BaseException as exc:
            cancelled.set()
            with contextlib.suppress(BaseException):
                (await joining).close()
            await self._forget_on_servers()
            if not isinstance(exc, Exception):
                raise
            raise WeightSyncError(f"could not open weight-update group {self.group_name!r} with {world - 1} server "
                                  f"rank(s): {exc}", "check the servers' logs; on CPU both sides must use backend "
                                  "gloo; or set training.weight_sync: disk") from exc
        self.groups_opened += 1

    async def _send(self, named: dict, version: int) -> int:
        """Broadcast `named` while the servers receive and load it; returns the bytes sent."""
        tensors = list(named.values())
        sending = asyncio.ensure_future(asyncio.to_thread(self.group.send, tensors, self.load_format))
        try:
            await self.client.update_weights_from_distributed(
                list(named), [dtype_name(t.dtype) for t in tensors], [list(t.shape) for t in tensors], str(version),
                group_name=self.group_name, load_format=self.load_format, timeout_s=self.timeout_s + 30)
            return await sending
        except BaseException as exc:
            # a server that refused before receiving leaves our broadcast waiting for its timeout:
            # give up on this group (the thread ends by itself) and open a new one next time
            sending.add_done_callback(lambda f: f.cancelled() or f.exception())
            group, self.group = self.group, None
            await self._forget_on_servers()
            group.close()
            if not isinstance(exc, Exception):
                raise
            raise WeightSyncError(f"distributed weight update to version {version} failed: {exc}",
                                  "see the message for the server's reason; the group is reopened on the next sync") from exc

    async def _forget_on_servers(self) -> None:
        with contextlib.suppress(Exception):
            await self.client.destroy_weights_update_group(self.group_name)

    async def close(self) -> None:
        """Leave the group on every server and here (a no-op when none is open)."""
        group, self.group = self.group, None
        if group is not None:
            try:
                await self.client.destroy_weights_update_group(self.group_name)
            finally:
                group.close()


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


TRANSPORTS = ("disk", "distributed")


def make_weight_sync(transport: str, client, export_root: Path, **options):
    """The `training.weight_sync` transport; `options` go to its constructor."""
    if transport == "disk":
        return DiskWeightSync(client, export_root, **options)
    if transport == "distributed":
        return DistributedWeightSync(client, **options)
    raise WeightSyncError(f"training.weight_sync: unknown transport {transport!r}",
                          f"set training.weight_sync to one of: {', '.join(TRANSPORTS)}")
