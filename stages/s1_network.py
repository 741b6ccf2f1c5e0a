"""Stage 1 - network and storage.

Checks: an all-reduce across ranks started by torch's launcher (gloo on CPU, NCCL on GPUs) is
correct, finishes before `stages.allreduce_timeout_s` (a rank that never joins is named) and
reaches `stages.allreduce_min_gbps` bus bandwidth; the file system of the run directory (where
checkpoints are written) takes sequential writes with fsync at `stages.checkpoint_write_min_mbps`,
small files at `stages.small_files_min_per_s`, and has room for the configured model's checkpoints;
the trajectory store is reachable and takes put, list, get, create-only put and delete under the
writer's partition layout; inside a sandbox a host loopback listener is refused, only `lo` exists,
and the egress allowlist lets through exactly what it lists. NCCL and cross-node runs are skipped,
saying what would run, where this host has no GPU or the cluster one node.
"""

from __future__ import annotations

from agentrl_cli.ops.bench import allreduce, storage
from agentrl_cli.ops.bench.objectstore import probe_store
from agentrl_cli.ops.bench.sandbox_net import sandbox_network_checks
from agentrl_cli.acceptance.context import StageContext
from agentrl_cli.core.report import Check, CheckStatus, StageReport


def run(ctx: StageContext) -> StageReport:
    cfg = ctx.config
    spec = allreduce.spec_from_config(cfg)
    checks, ran = ctx.produce("all-reduce completes", lambda: _allreduce(spec, cfg.stages.allreduce_min_gbps))
    if spec.backend != "nccl":
        why = ("no GPU here (cluster.gpus_per_node: 0), so the ranks used gloo" if not cfg.cluster.gpus_per_node
               else "training.dist_backend is gloo")
        checks.append(Check.skipped("all-reduce over NCCL", f"{why}; on GPU nodes this stage runs the same all-reduce with "
                                    "NCCL, one rank per GPU"))
    if cfg.cluster.nodes > 1:
        checks.append(Check.skipped(
            "cross-node all-reduce", f"this stage starts the ranks of this host only; across the {cfg.cluster.nodes} nodes run on "
            f"each node R: `agentrl bench allreduce --nnodes {cfg.cluster.nodes} --node-rank R --master-addr NODE0 --master-port PORT`"))
    checks += ctx.checks("checkpoint storage", lambda: _storage(ctx))
    checks += ctx.checks("object store reachable", lambda: probe_store(cfg.data))
    checks += ctx.checks("sandbox network isolated", lambda: sandbox_network_checks(cfg.sandbox, cfg.harnesses))
    env: dict = {"checkpoint_dir": str(ctx.run.path)}
    notes = []
    if ran is not None:
        env["allreduce"] = {"world_size": ran.world_size, "backend": ran.backend, "rows": ran.rows}
        notes.append(f"all-reduce launcher: {' '.join(ran.command[:12])} ...")
    return ctx.report(checks, notes, environment=env)


def _allreduce(spec, min_gbps: float) -> tuple[list[Check], allreduce.AllreduceResult]:
    result = allreduce.run_allreduce(spec)
    return allreduce.checks(result, min_gbps), result


def _storage(ctx: StageContext) -> list[Check]:
    cfg = ctx.config
    need, detail = None, ""
    try:
        from agentrl_cli.ops.plan import model_shape

        shape = model_shape(cfg.model)
        one = storage.checkpoint_bytes(shape.params, cfg.training.precision)
        keep = cfg.training.keep_last_checkpoints + 1
        need = one * keep
        detail = (f"{keep} checkpoints (training.keep_last_checkpoints + 1 being written) of {shape.params:,} parameters "
                  f"x {one // max(shape.params, 1)} B ({cfg.training.precision} + Adam) = {need / 1e9:.3f} GB")
    except Exception as exc:  # noqa: BLE001 - the model's size is unknown: free space is then not judged
        detail = f"model size unknown ({type(exc).__name__}: {exc})"
    res = storage.measure_storage(ctx.run.path, cfg.stages.storage_probe_mb, cfg.stages.small_files_count)
    checks = storage.checks(res, cfg.stages.checkpoint_write_min_mbps, cfg.stages.small_files_min_per_s, need, detail)
    if need is None and res.write_mbps is not None:
        checks.append(Check("free space for checkpoints", CheckStatus.FAIL, {"free_gb": round((res.free_bytes or 0) / 1e9, 2)},
                            "free space >= the configured model's checkpoints", detail,
                            "check model.path (`agentrl plan` shows the model's size)"))
    return checks
