"""The weight-update process group: the trainer (rank 0) broadcasts full parameters to inference
servers (ranks 1..N), as SGLang's `init_weights_update_group` / `update_weights_from_distributed`
do. Both sides use this module: the trainer in `weightsync/distributed.py`, the embedded server in
`engines/inference/hf_server.py`.

The group is stateless with respect to `torch.distributed`: a `TCPStore` and a `ProcessGroupGloo`
(or `ProcessGroupNCCL` on CUDA) built directly, never registered as, nor touching, any default
process group, so a trainer that already runs DeepSpeed's group can open one beside it. Rank 0
hosts the store on a socket it binds itself (to the master address only, not every interface);
gloo binds the local address that routes to the master (loopback for 127.0.0.1) unless
GLOO_SOCKET_IFNAME names an interface. Every wait has a timeout (DEFAULT_TIMEOUT_S), and rank 0's
wait for the others can be cancelled, so a refused HTTP call never leaves the trainer hanging.

What does not belong here: HTTP shapes (`hf_server.py`), loading tensors into a model (`engine.py`),
what to send (`weightsync/distributed.py`) and when (`weightsync/publisher.py`).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

DEFAULT_GROUP = "weight_update_group"
DEFAULT_TIMEOUT_S = 120.0
BACKENDS = ("gloo", "nccl")
BUCKET = "flattened_bucket"  # load_format: one flat buffer (one dtype) instead of one broadcast per tensor
_POLL_S = 0.02


class GroupCancelled(RuntimeError):
    """Rank 0 stopped waiting for the other ranks (cancelled, or they did not all join in time)."""


def backend_problem(backend: str) -> str | None:
    """Why `backend` cannot run in this process, or None when it can."""
    if backend not in BACKENDS:
        return f"backend {backend!r} is not supported; use one of {', '.join(BACKENDS)}"
    if backend == "nccl" and not torch.cuda.is_available():
        return ("backend 'nccl' needs CUDA, which this process does not have; pass backend='gloo' "
                "(the trainer must use gloo too: DistributedWeightSync(..., backend='gloo'))")
    return None


def default_backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def parse_dtype(name: str) -> torch.dtype:
    """'bfloat16' or 'torch.bfloat16' -> torch.bfloat16 (SGLang's `dtypes` strings)."""
    value = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}; use a torch dtype name such as 'float32' or 'bfloat16'")
    return value


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def listen(address: str, port: int = 0) -> socket.socket:
    """A listening TCP socket on `address` only (port 0: a free one), for rank 0's store."""
    family, _, _, _, sockaddr = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


def _local_address_towards(host: str) -> str:
    """The local address whose route reaches `host` (a UDP connect sends nothing)."""
    family, _, _, _, sockaddr = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect(sockaddr)
        return s.getsockname()[0]


@dataclass(eq=False)
class WeightGroup:
    """One open group; `send` on rank 0, `receive` on the others; `close()` when done."""

    name: str
    rank: int
    world_size: int
    backend: str
    store: object
    pg: object
    device: torch.device
    lock: threading.Lock = field(default_factory=threading.Lock)  # one transfer at a time

    def _broadcast(self, tensors: list[torch.Tensor]) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = 0, 0
        works = [self.pg.broadcast([t], opts) for t in tensors]  # issued in order, completed together
        for work in works:
            work.wait()

    def send(self, tensors: list[torch.Tensor], load_format: str | None = None) -> int:
        """Rank 0: broadcast `tensors` in order (or as one flat bucket); returns the bytes sent."""
        if self.rank != 0:
            raise RuntimeError(f"send is rank 0's; this is rank {self.rank} of group {self.name!r}")
        if load_format == BUCKET:
            if len({t.dtype for t in tensors}) > 1:
                raise ValueError(f"{BUCKET} needs one dtype for all tensors; got {sorted({str(t.dtype) for t in tensors})}")
            tensors = [torch.cat([t.detach().reshape(-1) for t in tensors])] if tensors else []
        staged = [t.detach().to(self.device).contiguous() for t in tensors]
        with self.lock:
            self._broadcast(staged)
        return sum(t.numel() * t.element_size() for t in staged)

    def receive(self, specs: list[tuple[str, torch.dtype, tuple[int, ...]]],
                load_format: str | None = None) -> dict[str, torch.Tensor]:
        """Ranks 1..N: receive one broadcast per (name, dtype, shape), in order, into new CPU tensors."""
        if load_format == BUCKET:
            dtypes = {dtype for _, dtype, _ in specs}
            if len(dtypes) > 1:
                raise ValueError(f"{BUCKET} needs one dtype for all tensors; got {sorted(map(str, dtypes))}")
            sizes = [int(torch.Size(shape).numel()) for _, _, shape in specs]
            flat = torch.empty(sum(sizes), dtype=specs[0][1] if specs else torch.float32, device=self.device)
            with self.lock:
                self._broadcast([flat] if specs else [])
            parts = flat.cpu().split(sizes)
            return {name: part.view(shape) for (name, _, shape), part in zip(specs, parts)}
        buffers = [torch.empty(shape, dtype=dtype, device=self.device) for _, dtype, shape in specs]
        with self.lock:
            self._broadcast(buffers)
        return {name: buf.cpu() for (name, _, _), buf in zip(specs, buffers)}

    def close(self) -> None:
        pg, self.pg, self.store = self.pg, None, None
        if pg is not None and self.backend == "nccl":
            try:
                pg.shutdown()
            except Exception:  # noqa: BLE001 - best effort: the group is being dropped anyway
                pass


def _rendezvous(store, rank: int, world_size: int, timeout_s: float, cancelled: threading.Event | None) -> None:
    """Every rank announces itself; rank 0 waits for all (cancellable) and says go or abort."""
    store.set(f"joined/{rank}", "1")
    if rank != 0:
        verdict = store.get("verdict")  # waits up to the store's timeout
        if verdict != b"go":
            raise GroupCancelled(f"rank 0 abandoned the group ({verdict.decode(errors='replace')})")
        return
    keys = [f"joined/{r}" for r in range(world_size)]
    deadline = time.monotonic() + timeout_s
    while not store.check(keys):
        stop = cancelled is not None and cancelled.is_set()
        if stop or time.monotonic() > deadline:
            joined = sum(store.check([k]) for k in keys)
            store.set("verdict", "cancelled" if stop else "timeout")
            raise GroupCancelled(f"{joined} of {world_size} ranks joined" + (" before the wait was cancelled" if stop
                                 else f" within {timeout_s:.0f} s; check that every server got init_weights_update_group"))
        time.sleep(_POLL_S)
    store.set("verdict", "go")


def open_group(master_address: str, master_port: int, rank: int, world_size: int, *, group_name: str = DEFAULT_GROUP,
               backend: str = "gloo", timeout_s: float = DEFAULT_TIMEOUT_S, listener: socket.socket | None = None,
               cancelled: threading.Event | None = None) -> WeightGroup:
    """Join group `group_name` as `rank` of `world_size`; blocks until every rank has joined.
    Rank 0 hosts the store on `listener` (made from master_address:master_port when not given)."""
    problem = backend_problem(backend)
    if problem:
        raise ValueError(problem)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside a group of world_size {world_size}")
    timeout = timedelta(seconds=timeout_s)
    if rank == 0:
        sock = listener or listen(master_address, master_port)
        # the store owns the listening socket from here on (it closes it when dropped)
        base = dist.TCPStore(master_address, sock.getsockname()[1], world_size, True, timeout,
                             wait_for_workers=False, master_listen_fd=sock.detach())
    else:
        base = dist.TCPStore(master_address, int(master_port), world_size, False, timeout)
    store = dist.PrefixStore(f"agentrl/{group_name}", base)
    _rendezvous(store, rank, world_size, timeout_s, cancelled)
    if backend == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        pg = dist.ProcessGroupNCCL(store, rank, world_size, opts)
    else:
        device = torch.device("cpu")
        opts = dist.ProcessGroupGloo._Options()
        opts._timeout = timeout
        ifname = os.environ.get("GLOO_SOCKET_IFNAME", "").split(",")[0]
        opts._devices = [dist.ProcessGroupGloo.create_device(interface=ifname) if ifname else
                         dist.ProcessGroupGloo.create_device(hostname=_local_address_towards(master_address))]
        pg = dist.ProcessGroupGloo(store, rank, world_size, opts)
    return WeightGroup(group_name, rank, world_size, backend, base, pg, device)


class WeightGroups:
    """The groups one inference server has joined, by name (SGLang's `_model_update_group`)."""

    def __init__(self) -> None:
        self._groups: dict[str, WeightGroup] = {}
        self._lock = threading.Lock()

    def open(self, group_name: str, **kwargs) -> WeightGroup:
        with self._lock:
            if group_name in self._groups:
                raise ValueError(f"group {group_name!r} is already initialized; destroy_weights_update_group first")
            self._groups[group_name] = None  # reserved while joining
        try:
            group = open_group(group_name=group_name, **kwargs)
        except BaseException:
            with self._lock:
                self._groups.pop(group_name, None)
            raise
        with self._lock:
            self._groups[group_name] = group
        return group

    def get(self, group_name: str) -> WeightGroup:
        group = self._groups.get(group_name)
        if group is None:
            known = [name for name, g in self._groups.items() if g is not None]
            raise KeyError(f"group {group_name!r} is not initialized (initialized: {known or 'none'}); "
                           "call init_weights_update_group first")
        return group

    def destroy(self, group_name: str) -> None:
        with self._lock:
            group = self.get(group_name)
            del self._groups[group_name]
        group.close()

    def close(self) -> None:
        with self._lock:
            groups, self._groups = [g for g in self._groups.values() if g is not None], {}
        for group in groups:
            group.close()
