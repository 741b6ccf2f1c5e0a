"""Weight-sync benchmark: seconds per verified sync with the `disk` transport (export safetensors,
`update_weights_from_disk`) and with the `distributed` one (broadcast over a gloo weight-update
group, `update_weights_from_distributed`), from a DeepSpeed trainer in this process to one embedded
server in its own process, on the built-in tiny model (a random one of the same shape when it is
not built). Rounds alternate the two transports, the trainer's weights change before every sync,
and the first distributed sync (which opens the group) is reported apart from the steady state.
No target: the ratio is reported (issue 6); a figure is "met" only when it was measured.

    python benchmarks/weight_sync.py [--json] [--model PATH] [--rounds 5]
"""

from __future__ import annotations

import asyncio
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402
import torch  # noqa: E402

from agentrl_cli.config import load_config  # noqa: E402
from benchmarks._common import default_model, figure, parser, report  # noqa: E402


def _perturb(backend, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in backend.module.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 1e-3)


async def _measure(backend, url: str, rounds: int) -> dict:
    from agentrl_cli.engines.inference.client import InferenceClient
    from agentrl_cli.weightsync.disk import DiskTransport
    from agentrl_cli.weightsync.distributed import DistributedTransport
    from agentrl_cli.weightsync.publisher import WeightPublisher

    client = InferenceClient(url, timeout_s=600)
    disk = WeightPublisher(DiskTransport(client, Path(tempfile.mkdtemp(prefix="agentrl-bench-w-"))), client)
    dist = WeightPublisher(DistributedTransport(client, backend="gloo"), client)
    version = 0
    try:
        for i in range(rounds):
            for sync in ((disk, dist) if i % 2 == 0 else (dist, disk)):  # alternate order: noise hits both alike
                version += 1
                _perturb(backend, version)
                await sync.sync(backend, version)
        return {"disk": disk.history, "distributed": dist.history, "final_version": version,
                "served_version": httpx.get(url + "/get_weight_version", timeout=30).json()["weight_version"]}
    finally:
        await dist.close()
        await client.close()


def main() -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--model", default="", help="model directory (default: the built-in tiny model when cached, else a random one)")
    p.add_argument("--rounds", type=int, default=5, help="syncs per transport (the first distributed one opens the group)")
    args = p.parse_args()
    from agentrl_cli.engines.inference.launcher import launch
    from agentrl_cli.learner.deepspeed_backend import DeepSpeedBackend
    from benchmarks.inference import _free_port

    model = Path(args.model) if args.model else default_model()
    cfg = load_config(None, [f"inference.port={_free_port()}"], env={}).config
    servers, urls = launch(cfg, str(model), Path(tempfile.mkdtemp(prefix="agentrl-bench-logs-")))
    backend = None
    try:
        backend = DeepSpeedBackend(str(model), cfg.training)
        t0 = time.perf_counter()
        result = asyncio.run(_measure(backend, urls[0], args.rounds))
        wall = time.perf_counter() - t0
    finally:
        if backend is not None:
            backend.close()
        for s in servers:
            s.stop()
    disk = [e["seconds"] for e in result["disk"]]
    steady = [e["seconds"] for e in result["distributed"] if e["init_s"] == 0]
    first = result["distributed"][0]
    verified = all(e["verified_tensors"] > 0 for e in result["disk"] + result["distributed"])
    measured = verified and bool(disk) and bool(steady) and result["served_version"] == str(result["final_version"])
    disk_s, dist_s = statistics.median(disk), (statistics.median(steady) if steady else float("nan"))
    ratio = disk_s / dist_s if measured and dist_s > 0 else float("nan")
    mb = first["bytes"] / 2**20
    figures = {
        "disk_sync_s": figure(disk_s, f"s per verified sync (median of {len(disk)})"),
        "distributed_sync_s": figure(dist_s, f"s per verified sync, group reused (median of {len(steady)})"),
        "distributed_first_sync_s": figure(first["seconds"], f"s (includes opening the group: {first['init_s']} s)"),
        "distributed_broadcast_load_s": figure(statistics.median(e["load_s"] for e in result["distributed"]),
                                               f"s to broadcast and load {first['tensors']} tensors ({mb:.1f} MiB)"),
        "weight_sync_distributed_vs_disk": figure(ratio, "x faster (disk s / distributed s; > 1: distributed is faster)",
                                                  None, measured and math.isfinite(ratio)),
        "benchmark_wall_s": figure(wall, "s"),
    }
    return report(figures, args.json)


if __name__ == "__main__":
    sys.exit(main())
