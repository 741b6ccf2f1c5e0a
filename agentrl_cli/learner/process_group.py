"""The collective process group a trainer rank joins: the launcher's (RANK, WORLD_SIZE and
MASTER_ADDR/PORT in the environment, as torchrun and the `deepspeed` launcher set them), or a
single-rank group in this process with an in-process store (no listening socket). Shared by every
trainer backend; a backend that has its own initialiser (DeepSpeed's `init_distributed`) passes it.

gloo binds to the loopback interface when the rendezvous is on 127.0.0.1; the environment
variables set here are restored by `close()`.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable

import torch


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def loopback_ifname() -> str:
    names = [name for _, name in socket.if_nameindex() if name.startswith("lo")]
    return names[0] if names else "lo"


class ProcessGroup:
    """Joins the launcher's process group, or makes a single-rank one on 127.0.0.1.
    `join(backend)` joins the group from the environment (default `init_process_group` with env://);
    `destroy()` tears down a group this object created."""

    def __init__(self, dist_backend: str, *, join: Callable[[str], None] | None = None,
                 destroy: Callable[[], None] | None = None) -> None:
        self.saved_env: dict[str, str | None] = {}
        self._destroy = destroy or torch.distributed.destroy_process_group
        self.created = not torch.distributed.is_initialized()
        single = self.created and not ("RANK" in os.environ and "WORLD_SIZE" in os.environ)
        if single:  # launch utilities read these; the group itself uses an in-process store
            self._setenv(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
        self.backend = dist_backend if dist_backend != "auto" else ("nccl" if torch.cuda.is_available() else "gloo")
        if self.backend == "gloo" and os.environ.get("MASTER_ADDR") in ("127.0.0.1", "localhost"):
            if "GLOO_SOCKET_IFNAME" not in os.environ:
                self._setenv(GLOO_SOCKET_IFNAME=loopback_ifname())  # bind gloo to loopback only
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if self.backend == "nccl":
            torch.cuda.set_device(self.local_rank)
        try:
            if single:
                torch.distributed.init_process_group(self.backend, store=torch.distributed.HashStore(), rank=0, world_size=1)
            if join is not None:
                join(self.backend)
            elif not torch.distributed.is_initialized():
                torch.distributed.init_process_group(self.backend)
        except BaseException:
            self.close()
            raise

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", self.local_rank) if self.backend == "nccl" else torch.device("cpu")

    def _setenv(self, **values: str) -> None:
        for key, value in values.items():
            self.saved_env.setdefault(key, os.environ.get(key))
            os.environ[key] = value

    def close(self) -> None:
        if self.created and torch.distributed.is_initialized():
            self._destroy()
        for key, value in self.saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self.saved_env = {}
