"""`agentrl bench allreduce|storage|store`: stage 1's measurements on their own."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from agentrl_cli.cli.commands.common import ConfigOpt, JsonOpt, SetOpt, checks_json, err, finish, load, out, print_json
from agentrl_cli.core.errors import UsageError
from agentrl_cli.cli.render import print_table, render_checks

app = typer.Typer(help="Measure collectives, checkpoint storage and the object store (stage 1's checks, one at a time).",
                  no_args_is_help=True)


@app.command("allreduce")
def allreduce_cmd(
    ranks: Annotated[Optional[int], typer.Option("--ranks", min=1, help="Ranks on this node (default: stages.allreduce_ranks; 0 there = one per GPU, or 2).", show_default=False)] = None,
    sizes: Annotated[str, typer.Option("--sizes", help="Message sizes, comma-separated (4K,64K,1M,4M); default: 4 KiB up to stages.allreduce_max_mb.")] = "",
    backend: Annotated[str, typer.Option("--backend", help="gloo, nccl, or auto (training.dist_backend: nccl with GPUs).")] = "auto",
    iters: Annotated[Optional[int], typer.Option("--iters", min=1, help="Timed iterations per round and size (default: 16 MiB worth, 5..50; 3 rounds, the fastest counts).", show_default=False)] = None,
    timeout: Annotated[Optional[float], typer.Option("--timeout", min=1, help="Deadline in seconds (default: stages.allreduce_timeout_s); ranks still running are killed and named.", show_default=False)] = None,
    nnodes: Annotated[int, typer.Option("--nnodes", min=1, help="Nodes in the rendezvous (run this command on each).")] = 1,
    node_rank: Annotated[int, typer.Option("--node-rank", min=0, help="This node's rank (0 hosts the rendezvous).")] = 0,
    master_addr: Annotated[str, typer.Option("--master-addr", help="Address of node 0.")] = "127.0.0.1",
    master_port: Annotated[Optional[int], typer.Option("--master-port", help="Port on node 0 (default: a free port; set it when nnodes > 1).", show_default=False)] = None,
    config: ConfigOpt = None,
    sets: SetOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """All-reduce bus bandwidth across ranks started by torch's launcher (gloo on CPU, NCCL on GPUs),
    per message size in the nccl-tests convention: algbw = bytes / time, busbw = algbw * 2(n-1)/n.
    Exit 0 pass, 1 a check failed (slow, wrong sums, or a rank that never joined), 2 bad usage.

    Examples:

    * `agentrl bench allreduce`

    * `agentrl bench allreduce --ranks 4 --sizes 1M,16M,64M --json`

    * on node R of 2: `agentrl bench allreduce --nnodes 2 --node-rank R --master-addr 10.0.0.1 --master-port 29500`
    """
    from agentrl_cli.ops.bench import allreduce as ar

    loaded = load(config, sets)
    cfg = loaded.config
    if backend not in ("auto", "gloo", "nccl"):
        raise UsageError(f"bad --backend {backend!r}", "use gloo, nccl or auto")
    if node_rank >= nnodes:
        raise UsageError(f"--node-rank {node_rank} is not below --nnodes {nnodes}", "node ranks are 0..nnodes-1")
    if nnodes > 1 and master_port is None:
        raise UsageError("--master-port is required with --nnodes > 1", "pick a port open on node 0, the same on every node")
    spec = ar.spec_from_config(cfg)
    try:
        if sizes:
            spec.sizes = tuple(ar.parse_size(s) for s in sizes.split(",") if s.strip())
    except ValueError as exc:
        raise UsageError(str(exc), "e.g. --sizes 4K,64K,1M") from None
    if backend != "auto":
        spec.backend = backend
    spec.ranks = ranks or spec.ranks
    spec.iters, spec.nnodes, spec.node_rank, spec.master_addr, spec.master_port = iters, nnodes, node_rank, master_addr, master_port
    spec.deadline_s = timeout or spec.deadline_s
    if not json_out:
        err().print(f"all-reduce: {spec.world_size} ranks ({spec.ranks} here), {spec.backend}, sizes {list(spec.sizes)}, "
                    f"deadline {spec.deadline_s:g} s")
    result = ar.run_allreduce(spec)
    checks = ar.checks(result, cfg.stages.allreduce_min_gbps)
    if json_out:
        print_json(checks_json(checks, result=result.to_dict()))
    else:
        if result.rows:
            t = Table("bytes", "iters", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "correct", title="all-reduce", title_justify="left")
            for r in result.rows:
                t.add_row(str(r["bytes"]), str(r["iters"]), f"{r['time_us']:.1f}", f"{r['algbw_gbps']:.4f}",
                          f"{r['busbw_gbps']:.4f}", "yes" if r["correct"] else "NO")
            print_table(out(), t)
        render_checks(out(), checks, "checks")
    finish(checks)


@app.command("storage")
def storage_cmd(
    directory: Annotated[Optional[Path], typer.Option("--dir", help="Directory to measure (default: observe.runs_dir, where checkpoints are written).", show_default=False)] = None,
    size_mb: Annotated[Optional[int], typer.Option("--size-mb", min=1, help="MiB written sequentially (default: stages.storage_probe_mb).", show_default=False)] = None,
    files: Annotated[Optional[int], typer.Option("--files", min=10, help="Small files created (default: stages.small_files_count).", show_default=False)] = None,
    config: ConfigOpt = None,
    sets: SetOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Checkpoint storage: sequential write MB/s with fsync, small-file creates per second, and free
    space against the configured model's checkpoints. Everything written is removed.
    Exit 0 pass, 1 a check failed (slow, unwritable, too little space), 2 bad usage.

    Examples:

    * `agentrl bench storage`

    * `agentrl bench storage --dir /mnt/pfs/checkpoints --size-mb 1024 --json`
    """
    from agentrl_cli.ops.bench import storage

    loaded = load(config, sets)
    cfg = loaded.config
    target = directory or Path(cfg.observe.runs_dir)
    need, detail = None, ""
    try:
        from agentrl_cli.ops.plan import model_shape

        shape = model_shape(cfg.model)
        one = storage.checkpoint_bytes(shape.params, cfg.training.precision)
        need = one * (cfg.training.keep_last_checkpoints + 1)
        detail = f"{cfg.training.keep_last_checkpoints + 1} checkpoints of {shape.params:,} parameters ({one / 1e9:.3f} GB each)"
    except Exception as exc:  # noqa: BLE001 - free space is then reported, not judged
        detail = f"model size unknown: {exc}"
    res = storage.measure_storage(target, size_mb or cfg.stages.storage_probe_mb, files or cfg.stages.small_files_count)
    checks = storage.checks(res, cfg.stages.checkpoint_write_min_mbps, cfg.stages.small_files_min_per_s, need, detail)
    if json_out:
        print_json(checks_json(checks, result=res.to_dict()))
    else:
        render_checks(out(), checks, f"storage: {target}")
    finish(checks)


@app.command("store")
def store_cmd(config: ConfigOpt = None, sets: SetOpt = None, json_out: JsonOpt = False) -> None:
    """The trajectory store (data.store): reachable, put, list, get, create-only put, delete, under
    the writer's partition layout; the probe object is removed. Exit 0 pass, 1 a check failed.

    Examples:

    * `agentrl bench store`

    * `agentrl bench store --set data.store=s3 --set data.s3.endpoint_url=http://127.0.0.1:9000 --json`
    """
    from agentrl_cli.ops.bench.objectstore import probe_store

    cfg = load(config, sets).config
    checks = probe_store(cfg.data)
    if json_out:
        print_json(checks_json(checks))
    else:
        render_checks(out(), checks, f"trajectory store ({cfg.data.store})")
    finish(checks)
