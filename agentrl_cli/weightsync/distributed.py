"""`distributed`: the trainer (rank 0) and every server join a weight-update process group once
(`init_weights_update_group`, gloo on CPU, NCCL on GPUs); each publish broadcasts every parameter
while the servers receive it (`update_weights_from_distributed`). No file is written, so a restarted
server cannot be reloaded alone (`resend` is False: the publisher syncs every server in full).

Server i takes group ranks from 1 + i * ranks_per_server (its tensor-parallel size: SGLang joins
one rank per GPU; 1 for the embedded server). It needs each server's own URL, not a router's.
After a failed transfer the group is dropped on both sides and the next publish opens a new one.
The group itself lives in `group.py`.

Every wait ends by `training.weight_sync_timeout_s`: the servers joining the group (a server that
never calls in fails the open as soon as the trainer's own wait for it ends, not when its HTTP
answer times out) and each broadcast; either raises `WeightSyncError` naming the key.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import TYPE_CHECKING

from agentrl_cli.weightsync.base import Prepared, Published, WeightSyncError
from agentrl_cli.engines.weight_group import (
    DEFAULT_GROUP,
    DEFAULT_TIMEOUT_S,
    default_backend,
    dtype_name,
    listen,
    open_group,
)

if TYPE_CHECKING:
    from agentrl_cli.learner.backend import TrainingBackend

TIMEOUT_KEY = "training.weight_sync_timeout_s"


class DistributedTransport:
    name = "distributed"
    hint = "and that the group's backend suits both sides"

    def __init__(self, client, *, backend: str = "auto", group_name: str = DEFAULT_GROUP,
                 master_address: str = "127.0.0.1", ranks_per_server: int = 1, load_format: str | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.client = client
        self.backend = default_backend() if backend == "auto" else backend
        self.group_name, self.master_address, self.ranks_per_server = group_name, master_address, ranks_per_server
        self.load_format, self.timeout_s = load_format, timeout_s
        self.group = None
        self.groups_opened = 0

    @classmethod
    def from_config(cls, cfg, client, workdir) -> "DistributedTransport":
        from agentrl_cli.weightsync.registry import ranks_per_server

        return cls(client, ranks_per_server=ranks_per_server(cfg), timeout_s=cfg.training.weight_sync_timeout_s)

    async def prepare(self, backend: TrainingBackend, version: int) -> Prepared:
        """Copies of the trainer's parameters (every rank calls it; {} except on rank 0)."""
        named = await asyncio.to_thread(backend.named_tensors)
        return Prepared(version=version, payload=named, rank=backend.rank)

    async def publish(self, prepared: Prepared) -> Published:
        named = prepared.payload
        t0 = time.perf_counter()
        init_s, sent = 0.0, 0
        if prepared.rank == 0:
            if self.group is None:
                await self._open()
                init_s = time.perf_counter() - t0
            sent = await self._send(named, prepared.version)
        return Published(prepared.version, self.name,
                         timings={"init_s": init_s, "load_s": time.perf_counter() - t0 - init_s},
                         details={"group": self.group_name, "backend": self.backend, "tensors": len(named), "bytes": sent})

    async def resend(self, urls: list[str], last: Published) -> bool:
        return False  # the group broadcasts to every server at once

    async def _open(self) -> None:
        """Join as rank 0 while every server joins over HTTP: the rendezvous needs both at once."""
        world = 1 + len(self.client.urls) * self.ranks_per_server
        sock = listen(self.master_address, 0)
        port, cancelled = sock.getsockname()[1], threading.Event()
        # the engine's own rendezvous where its servers join differently (vLLM's), agentrl's otherwise
        opener = getattr(self.client.engine, "trainer_group", None)
        joining = asyncio.ensure_future(asyncio.to_thread(
            opener() if opener is not None else open_group, self.master_address, port, 0, world,
            group_name=self.group_name, backend=self.backend,
            timeout_s=self.timeout_s, listener=sock, cancelled=cancelled))
        asking = asyncio.ensure_future(self.client.init_weights_update_group(
            self.master_address, port, world, group_name=self.group_name, backend=self.backend,
            ranks_per_server=self.ranks_per_server, timeout_s=self.timeout_s + 30))
        try:
            await _both(asking, joining)
            self.group = joining.result()
        except BaseException as exc:
            cancelled.set()
            asking.cancel()
            with contextlib.suppress(BaseException):
                (await joining).close()
            await self._forget_on_servers()
            if not isinstance(exc, Exception):
                raise
            raise WeightSyncError(f"could not open weight-update group {self.group_name!r} with {world - 1} server "
                                  f"rank(s) within {self.timeout_s:g} s ({TIMEOUT_KEY}): {exc}",
                                  "check the servers' logs; on CPU both sides must use backend gloo; raise "
                                  f"{TIMEOUT_KEY} for slow servers; or set training.weight_sync: disk") from exc
        self.groups_opened += 1

    async def _send(self, named: dict, version: int) -> int:
        """Broadcast `named` while the servers receive and load it; returns the bytes sent."""
        tensors = list(named.values())
        sending = asyncio.ensure_future(asyncio.to_thread(self.group.send, tensors, self.load_format))
        loading = asyncio.ensure_future(self.client.update_weights_from_distributed(
            list(named), [dtype_name(t.dtype) for t in tensors], [list(t.shape) for t in tensors], str(version),
            group_name=self.group_name, load_format=self.load_format, timeout_s=self.timeout_s + 30))
        try:
            await _both(loading, sending)
            return sending.result()
        except BaseException as exc:
            loading.cancel()
            # a server that refused before receiving leaves our broadcast waiting for its timeout:
            # give up on this group (the thread ends by itself) and open a new one next time
            sending.add_done_callback(lambda f: f.cancelled() or f.exception())
            group, self.group = self.group, None
            await self._forget_on_servers()
            group.close()
            if not isinstance(exc, Exception):
                raise
            raise WeightSyncError(f"distributed weight update to version {version} failed (each wait bounded by "
                                  f"{self.timeout_s:g} s, {TIMEOUT_KEY}): {exc}",
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


async def _both(a: asyncio.Future, b: asyncio.Future) -> None:
    """Wait for two halves of one exchange (the HTTP call and the trainer's side of the group): the
    first to fail ends the wait with its error, so neither side's failure waits out the other's timeout."""
    done, _ = await asyncio.wait({a, b}, return_when=asyncio.FIRST_EXCEPTION)
    for f in done:
        if f.exception() is not None:
            raise f.exception()
