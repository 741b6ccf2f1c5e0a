"""The trainer's end of vLLM's NCCL weight transfer: vLLM's workers join the trainer's group through
vLLM's own `StatelessProcessGroup` and `PyNcclCommunicator` (`/init_weight_transfer_engine`), so rank 0
must open it the same way, with vLLM's `trainer_init`, and broadcast each tensor in the order of the
`update_info` names (vLLM's unpacked path, `packed: false`, the default of its workers' init info).

This needs vLLM and a CUDA device in the trainer's process; nothing here runs on a CPU box, and it has
not been exercised on one: the embedded server in vLLM's dialect keeps agentrl's own group
(`weight_group.py`, gloo), which is what this machine's tests cover. Belongs here: that group. Does
not: the HTTP side of the transfer (`vllm_dialect.py`), when to publish (`weightsync/`).
"""

from __future__ import annotations

import socket
import threading

import torch

INSTALL_HINT = ("install vLLM beside the trainer (pip install 'agentrl-cli[vllm]') and give it a CUDA device, "
                "or set training.weight_sync: disk")


class VLLMTrainerGroup:
    """Rank 0 of a vLLM weight-transfer group: `send` broadcasts, `close` destroys the communicator."""

    rank = 0

    def __init__(self, master_address: str, master_port: int, world_size: int) -> None:
        try:
            from vllm.distributed.weight_transfer.nccl_common import trainer_init
        except ImportError as exc:
            raise RuntimeError(f"vLLM's weight transfer needs vLLM in the trainer's process ({exc}); {INSTALL_HINT}") from None
        if not torch.cuda.is_available():
            raise RuntimeError(f"vLLM's weight transfer is NCCL, which needs a CUDA device here; {INSTALL_HINT}")
        self.world_size = world_size
        self.comm = trainer_init({"master_address": master_address, "master_port": master_port, "world_size": world_size})

    def send(self, tensors: list[torch.Tensor], load_format: str | None = None) -> int:
        """Broadcast `tensors` one by one from rank 0; returns the bytes sent."""
        if load_format not in (None, ""):
            raise ValueError(f"vLLM's unpacked transfer sends tensors one by one; load_format {load_format!r} is SGLang's")
        sent = 0
        stream = torch.cuda.current_stream()
        for t in tensors:
            staged = t.detach().to("cuda").contiguous()
            self.comm.broadcast(staged, src=0, stream=stream)
            sent += staged.numel() * staged.element_size()
        stream.synchronize()
        return sent

    def close(self) -> None:
        comm, self.comm = self.comm, None
        if comm is not None:
            comm.destroy()


def open_vllm_group(master_address: str, master_port: int, rank: int, world_size: int, *, listener: socket.socket | None = None,
                    cancelled: threading.Event | None = None, **_) -> VLLMTrainerGroup:
    """`weight_group.open_group`'s signature for the trainer's rank 0 of vLLM's transfer (vLLM's store
    binds the port itself, so a listener reserved for it is closed first)."""
    if rank != 0:
        raise ValueError(f"the trainer is rank 0 of vLLM's weight transfer, not {rank}")
    if listener is not None:
        listener.close()
    return VLLMTrainerGroup(master_address, master_port, world_size)
