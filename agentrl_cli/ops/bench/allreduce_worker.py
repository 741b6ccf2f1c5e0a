"""One rank of the all-reduce benchmark, started by the same launcher training uses:

    python -m torch.distributed.run --nproc-per-node 2 --master-addr 127.0.0.1 --master-port 29511 \\
        -m agentrl_cli.ops.bench.allreduce_worker --out DIR --sizes 4096,1048576 --iters 10

Every rank leaves a sign of life in `DIR/rank-<R>.json` (pid, host, phase) before it joins the
process group and after each phase, so a launcher that kills a hung run can name the rank that never
arrived or the phase it stopped in. Per message size: one correctness all-reduce (rank r contributes
r+1, every element must equal n(n+1)/2), warm-up, then `rounds` rounds of `iters` timed all-reduces
of float32 zeros; a rank's time per call is the mean of its fastest round (other work on the host
only ever slows a round down), reduced over ranks with MAX (the slowest rank sets the time).
Rank 0 writes `DIR/result.json`. Belongs here: the rank's loop only; judging is in `allreduce.py`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import socket
import sys
import time
from pathlib import Path


def _mark(out: Path, rank: int, phase: str) -> None:
    path = out / f"rank-{rank}.json"
    tmp = out / f".rank-{rank}.json.tmp"
    tmp.write_text(json.dumps({"rank": rank, "pid": os.getpid(), "host": socket.gethostname(), "phase": phase,
                               "at": time.time()}))
    os.replace(tmp, path)


def time_allreduce(buf, iters: int, rounds: int) -> float:
    """Seconds per all-reduce of `buf` on this rank: the mean of the fastest of `rounds` rounds of
    `iters` calls, each round started together (barrier) and ended with the device synchronised."""
    import torch
    import torch.distributed as dist

    def sync() -> None:
        if buf.is_cuda:
            torch.cuda.synchronize(buf.device)

    best = float("inf")
    for _ in range(rounds):
        sync()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(buf)
        sync()
        best = min(best, (time.perf_counter() - t0) / iters)
    return best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--sizes", required=True, help="message sizes in bytes, comma-separated")
    p.add_argument("--iters", required=True, help="timed iterations per size, comma-separated (one per size)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3, help="timed rounds per size; the fastest round's mean counts")
    p.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    p.add_argument("--timeout", type=float, default=120.0, help="process-group timeout in seconds")
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help="set by the deepspeed launcher")
    args = p.parse_args(argv)
    out = Path(args.out)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", args.local_rank or 0))
    _mark(out, rank, "arrived")
    if args.backend == "gloo" and os.environ.get("MASTER_ADDR") in ("127.0.0.1", "localhost"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", next((n for _, n in socket.if_nameindex() if n.startswith("lo")), "lo"))
    import torch
    import torch.distributed as dist

    device = torch.device("cpu")
    if args.backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    dist.init_process_group(args.backend, timeout=dt.timedelta(seconds=args.timeout))
    _mark(out, rank, "joined")

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    sizes = [int(s) for s in args.sizes.split(",")]
    iters = [int(s) for s in args.iters.split(",")]
    rows = []
    for size, n_iter in zip(sizes, iters):
        count = max(1, size // 4)
        probe = torch.full((count,), float(rank + 1), dtype=torch.float32, device=device)
        dist.all_reduce(probe)
        expected = world * (world + 1) / 2
        correct = bool(torch.all(probe == expected).item())
        buf = torch.zeros(count, dtype=torch.float32, device=device)
        for _ in range(args.warmup):
            dist.all_reduce(buf)
        best = time_allreduce(buf, n_iter, args.rounds)
        mean = torch.tensor([best], dtype=torch.float64, device=device)
        dist.all_reduce(mean, op=dist.ReduceOp.MAX)
        ok = torch.tensor([1 if correct else 0], dtype=torch.int32, device=device)
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
        rows.append({"bytes": count * 4, "count": count, "iters": n_iter, "rounds": args.rounds, "time_s": float(mean.item()),
                     "correct": bool(ok.item())})
        _mark(out, rank, f"size {count * 4}")
    dist.barrier()
    if rank == 0:
        result = {"world_size": world, "backend": args.backend, "device": device.type, "rows": rows,
                  "torch": torch.__version__,
                  "nccl": ".".join(map(str, torch.cuda.nccl.version())) if args.backend == "nccl" else None}
        tmp = out / ".result.json.tmp"
        tmp.write_text(json.dumps(result))
        os.replace(tmp, out / "result.json")
    _mark(out, rank, "done")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
