"""One trainer rank of a multi-rank run: the program the torchrun or `deepspeed` launcher starts on
every rank (`ranks_backend.py` builds the command line and drives it).

    python -m torch.distributed.run --nproc_per_node 2 --nnodes 1 --master_addr 127.0.0.1 \\
        --master_port 29500 -m agentrl_cli.learner.rank_worker --model DIR --control DIR

Every rank builds the `training.backend` backend through `backends.py` (DeepSpeed joins the
launcher's process group). Rank 0 also serves
the command channel for the run's process: a `multiprocessing.connection` socket on 127.0.0.1
(challenge-response with the key in `<control>/authkey`), whose port and the ranks' pids it writes
to `<control>/channel.json` once every rank is up. Each command is broadcast to every rank, run on
every rank (train_step on the rank's contiguous shard of the samples), and rank 0 answers with the
results of all ranks combined: the rank-averaged loss, token-weighted diagnostics, summed counts.
When the channel closes (the run's process ended or said `close`) every rank leaves cleanly.

What belongs here: the channel's server side, sharding and combining. Not here: the launcher and
failure reporting (`ranks_backend.py`), the step itself (`deepspeed_backend.py`).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import socket
import sys
import traceback
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge
from pathlib import Path

import numpy as np

from agentrl_cli.learner.corrections import POLICY_LAG
from agentrl_cli.learner.grpo import Sample

CHANNEL_FILE = "channel.json"
AUTHKEY_FILE = "authkey"
CONFIG_FILE = "training.json"
ACCEPT_TIMEOUT_S = 600.0  # the run's process connects as soon as channel.json appears
TOKEN_WEIGHTED = ("clip_fraction", "approx_kl", "entropy", "mismatch_kl", "kl_ref", POLICY_LAG)


def shard(samples: list[Sample], rank: int, world_size: int) -> tuple[list[Sample], int]:
    """This rank's contiguous share of `samples` (sizes differ by at most one) and its real count.
    Every share is padded to the same length with copies of the first sample whose loss mask is
    all zero: they add nothing to the loss or the gradient, but every rank then runs the same
    number of micro-batches (ZeRO reduces inside backward, so unequal counts would hang)."""
    base, extra = divmod(len(samples), world_size)
    start = rank * base + min(rank, extra)
    mine = list(samples[start:start + base + (rank < extra)])
    real = len(mine)
    first = samples[0]
    blank = Sample(first.token_ids, np.zeros(len(first.loss_mask), dtype=np.int8), first.logprobs, 0.0, first.ref_logprobs)
    return mine + [blank] * (base + (extra > 0) - real), real


def combine_metrics(per_rank: list[dict]) -> dict:
    """One step's metrics over all ranks: the mean of the ranks' losses (each is its share of the
    global token mean times the world size, see deepspeed_backend), token-weighted means of the
    per-token diagnostics, summed tokens and samples; grad_norm, lr, step and the importance-weight
    diagnostics (gathered over all ranks by each) are the same on every rank and taken from rank 0."""
    out = dict(per_rank[0])
    tokens = [m.get("tokens", 0) for m in per_rank]
    out["loss"] = sum(m["loss"] for m in per_rank) / len(per_rank)
    for key in TOKEN_WEIGHTED:  # over the ranks that report it (a rank of padding only has no policy lag)
        having = [(m[key], t) for m, t in zip(per_rank, tokens) if key in m]
        if having:
            weight = sum(t for _, t in having)
            out[key] = (sum(v * t for v, t in having) / weight if weight else sum(v for v, _ in having) / len(having))
    out["tokens"] = sum(tokens)
    out["samples"] = sum(m.get("samples", 0) for m in per_rank)
    return out


class Handlers:
    """The commands, run on every rank; each returns this rank's part of the answer."""

    def __init__(self, backend) -> None:
        self.backend = backend

    def hello(self) -> dict:
        return {"pid": os.getpid(), "host": socket.gethostname()}

    def train_step(self, samples: list[Sample]) -> dict:
        mine, real = shard(samples, self.backend.rank, self.backend.world_size)
        metrics = self.backend.train_step(mine)
        metrics["samples"] = real
        return metrics

    def save_checkpoint(self, dir: str, client_state: dict) -> None:
        self.backend.save_checkpoint(Path(dir), client_state)

    def load_checkpoint(self, dir: str) -> dict:
        return self.backend.load_checkpoint(Path(dir))

    def export_weights(self, dir: str) -> str:
        return str(self.backend.export_weights(Path(dir)))

    def export_adapter(self, dir: str) -> str:
        return str(self.backend.export_adapter(Path(dir)))

    def named_tensors(self) -> dict:
        return self.backend.named_tensors()

    def parameter_names(self) -> list:
        return self.backend.parameter_names()

    def named_parameter_sample(self, names: list[str], n: int) -> dict:
        return self.backend.named_parameter_sample(names, n)

    def close(self) -> None:
        return None


COMMANDS = ("hello", "train_step", "save_checkpoint", "load_checkpoint", "export_weights", "export_adapter",
            "named_tensors", "parameter_names", "named_parameter_sample", "close")


def _error(exc: BaseException) -> dict:
    return {"type": f"{type(exc).__module__}:{type(exc).__qualname__}", "message": getattr(exc, "message", str(exc)),
            "hint": getattr(exc, "hint", ""), "traceback": traceback.format_exc()}


def answer(name: str, parts: list[dict]) -> dict:
    """Rank 0's reply from every rank's (ok, value) part: the first rank's error, or the result."""
    for rank, part in enumerate(parts):
        if not part["ok"]:
            return {"ok": False, "rank": rank, "error": part["error"], "step": parts[0]["step"]}
    values = [p["value"] for p in parts]
    if name == "train_step":
        value = combine_metrics(values)
    elif name == "hello":
        value = {"pids": [v["pid"] for v in values], "hosts": [v["host"] for v in values]}
    else:
        value = values[0]  # rank 0's (named_tensors: only rank 0 holds them)
    return {"ok": True, "value": value, "step": parts[0]["step"]}


def _accept(server: socket.socket, authkey: bytes) -> Connection:
    """The run's process, authenticated both ways (as `multiprocessing.connection.Listener` does)."""
    server.settimeout(ACCEPT_TIMEOUT_S)
    sock, _ = server.accept()
    sock.settimeout(None)
    conn = Connection(sock.detach())
    deliver_challenge(conn, authkey)
    answer_challenge(conn, authkey)
    return conn


def _publish(control: Path, info: dict) -> None:
    tmp = control / f".{CHANNEL_FILE}.tmp"
    tmp.write_text(json.dumps(info), encoding="utf-8")
    os.replace(tmp, control / CHANNEL_FILE)


class Channel:
    """Rank 0's end of the command channel. `hello` is the first command of every rank; its answer
    (the ranks' pids) is published with the port, and goes to the run's process once it connects."""

    def __init__(self, control: Path) -> None:
        self.control, self.conn = control, None
        self.server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(1)
        self.said_hello = False

    def next_command(self) -> tuple[str, dict]:
        if not self.said_hello:
            return ("hello", {})
        if self.conn is None:
            return ("close", {})
        try:
            return pickle.loads(self.conn.recv_bytes())
        except (EOFError, OSError):  # the run's process is gone: every rank leaves
            self.conn = None
            return ("close", {})

    def reply(self, name: str, reply: dict, world_size: int) -> None:
        if name == "hello":
            self.said_hello = True
            _publish(self.control, {"port": self.server.getsockname()[1], "world_size": world_size,
                                    **reply.get("value", {}), "step": reply["step"]})
            try:
                self.conn = _accept(self.server, (self.control / AUTHKEY_FILE).read_bytes())
            finally:
                self.server.close()
        if self.conn is None:
            return
        try:
            self.conn.send_bytes(pickle.dumps(reply))
        except OSError:
            self.conn = None
        if name == "close" and self.conn is not None:
            self.conn.close()


def serve(backend, control: Path) -> None:
    """Run commands on every rank until `close`, or until the run's process goes away."""
    import torch.distributed as dist

    handlers = Handlers(backend)
    channel = Channel(control) if backend.rank == 0 else None
    while True:
        box = [channel.next_command() if channel is not None else None]
        dist.broadcast_object_list(box, src=0)
        name, kwargs = box[0]
        try:
            if name not in COMMANDS:
                raise ValueError(f"unknown trainer command {name!r}; known: {', '.join(COMMANDS)}")
            part = {"ok": True, "value": getattr(handlers, name)(**kwargs)}
        except Exception as exc:  # noqa: BLE001 - the run's process raises it; the ranks stay in step
            part = {"ok": False, "error": _error(exc)}
        part["step"] = backend.step
        parts: list | None = [None] * backend.world_size if backend.rank == 0 else None
        dist.gather_object(part, parts, dst=0)
        if channel is not None:
            channel.reply(name, answer(name, parts), backend.world_size)
        if name == "close":
            return


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rank_worker", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="Hugging Face model directory to train")
    parser.add_argument("--control", type=Path, required=True,
                        help=f"directory with {CONFIG_FILE} and {AUTHKEY_FILE}; rank 0 writes {CHANNEL_FILE} there")
    parser.add_argument("--temperature", type=float, default=1.0,
                        help="the sampling temperature (inference.temperature): log-probs are log_softmax(logits / T)")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.local_rank is not None:
        os.environ.setdefault("LOCAL_RANK", str(args.local_rank))

    from agentrl_cli.config.models import TrainingConfig
    from agentrl_cli.core.redaction import protect_process
    from agentrl_cli.learner.backend import backend_class, build_backend

    protect_process()  # the secrets this rank's environment holds never reach trainer-ranks.log
    from agentrl_cli.core.logstreams import LEVEL_ENV, configure_logging

    configure_logging(os.environ.get(LEVEL_ENV, "info"))  # the run's observe.log_level (ranks_backend passes it)
    config = TrainingConfig.model_validate_json((args.control / CONFIG_FILE).read_text(encoding="utf-8"))
    backend = build_backend(backend_class(config), args.model, config, args.temperature)
    try:
        serve(backend, args.control)
    finally:
        backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
