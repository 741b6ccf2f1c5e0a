"""The parallel-strategy stress table (seed 003: "stress-test the parallel strategies on a small model,
then choose the configuration"): for each strategy (DeepSpeed ZeRO 0-3, FSDP full sharding) and rank
count, one process or one torchrun (gloo on CPU) runs `stress_worker.py`, so peaks never mix; each
row has the peak memory per rank (the highest over the ranks) and the step time per micro-batch
size, a least-squares fit memory = a + b·mbs over those sizes, and the largest micro-batch that fit
predicts within the memory budget.

Belongs here: the strategies, starting the workers, reading and fitting their results. Not here:
judging the rows (`probes.py`), the worker itself.
"""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys
import time
from pathlib import Path

from agentrl_cli.core import parts
from agentrl_cli.acceptance.select import stress_worker

ZERO_STAGES = (0, 1, 2, 3)
SEQ_LEN = 64
STEPS_PER_SIZE = 2  # the step time is the faster of the two: the first also warms up
CELL_TIMEOUT_S = 300.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def all_strategies() -> list[str]:
    return [s for b in parts.names(parts.BACKENDS) for s, _ in strategies(b)]


def strategies(backend: str) -> list[tuple[str, dict]]:
    """(strategy name, training.* keys) of the strategies a backend offers."""
    row = parts.row(parts.BACKENDS, backend)
    if row is not None and "zero_stage" in row.honours:  # one strategy per ZeRO stage it reads
        return [(f"zero{s}", {"backend": backend, "zero_stage": s}) for s in ZERO_STAGES]
    return [(backend, {"backend": backend})]  # fsdp: full sharding when world_size > 1, one strategy


def fit(points: list[dict], key: str = "peak_mib") -> dict | None:
    """Least squares memory = a + b·mbs over the points (None below two distinct sizes)."""
    xs = [p["mbs"] for p in points]
    ys = [p[key] for p in points]
    if len(set(xs)) < 2:
        return None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return {"a_mib": round(my - b * mx, 2), "b_mib": round(b, 3), "points": len(xs), "of": key}


def largest_micro_batch(f: dict | None, budget_mib: float) -> int | None:
    """The largest micro-batch the fit puts within the budget: 0 when even the fixed part exceeds
    it, None when the fit gives no bound (no fit, or memory that did not grow with the batch)."""
    if f is None or f["b_mib"] <= 0:
        return None
    return max(0, math.floor((budget_mib - f["a_mib"]) / f["b_mib"]))


def combine(ranks: list[dict]) -> list[dict]:
    """Per micro-batch size, the highest peak and the slowest step over the ranks."""
    by_size: dict[int, dict] = {}
    for r in ranks:
        for p in r["points"]:
            row = by_size.setdefault(p["mbs"], {"mbs": p["mbs"], "peak_mib": 0.0, "step_s": 0.0})
            row["peak_mib"] = max(row["peak_mib"], p["peak_mib"])
            row["step_s"] = max(row["step_s"], p["step_s"])
            if "cuda_peak_mib" in p:
                row["cuda_peak_mib"] = max(row.get("cuda_peak_mib", 0.0), p["cuda_peak_mib"])
    return [by_size[k] for k in sorted(by_size)]


def run_cell(cfg, model: Path, strategy: str, keys: dict, ranks: int, micro_batches: list[int], budget_gb: float,
             workdir: Path, timeout_s: float = CELL_TIMEOUT_S) -> dict:
    """One row of the table: start the worker(s), wait (with a deadline), read and fit."""
    from agentrl_cli.config.load import with_overrides
    from agentrl_cli.learner.ranks_backend import rank_environment

    cell_dir = workdir / f"{strategy}-{ranks}"
    cell_dir.mkdir(parents=True, exist_ok=True)
    training = {**keys, "world_size": ranks, "micro_batch_size": max(micro_batches), "gradient_accumulation_steps": 1,
                "checkpoint_interval_steps": 10_000, "resume_from_latest": False}
    cell_cfg = with_overrides(cfg, {f"training.{k}": v for k, v in training.items()}, f"agentrl select: {strategy}")
    spec = {"model": str(Path(model).absolute()), "training": cell_cfg.training.model_dump(mode="json"),
            "micro_batches": sorted(micro_batches), "seq_len": SEQ_LEN, "steps": STEPS_PER_SIZE, "out": str(cell_dir / "out")}
    (cell_dir / "spec.json").write_text(json.dumps(spec), encoding="utf-8")
    worker = ["-m", stress_worker.__name__, "--spec", str(cell_dir / "spec.json")]
    cmd = [sys.executable, *worker] if ranks == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks), "--nnodes", "1",
        "--master_addr", "127.0.0.1", "--master_port", str(free_port()), "--max_restarts", "0", *worker]
    row = {"strategy": strategy, "ranks": ranks, "training": keys, "points": [], "status": "ok"}
    started = time.monotonic()
    log = cell_dir / "worker.log"
    with log.open("wb") as f:
        try:
            rc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT, env=rank_environment(cell_cfg),
                                timeout=timeout_s, start_new_session=True).returncode
        except subprocess.TimeoutExpired:
            rc = None
    row["wall_s"] = round(time.monotonic() - started, 2)
    results = [json.loads(p.read_text()) for p in sorted((cell_dir / "out").glob("rank-*.json"))]
    errors = [r["error"] for r in results if r.get("error")]
    if rc is None or rc != 0 or len(results) != ranks or errors:
        tail = log.read_text(errors="replace")[-600:]
        why = (f"did not finish within {timeout_s:.0f} s" if rc is None else f"exit status {rc}") if not errors else errors[0]
        row.update(status="error", error=why, log=str(log), log_tail=tail)
    row["points"] = combine(results)
    row["build_s"] = max((r.get("build_s") or 0.0 for r in results), default=None)
    memory_key = "cuda_peak_mib" if row["points"] and "cuda_peak_mib" in row["points"][0] else "peak_mib"
    row["fit"] = fit(row["points"], memory_key)
    row["max_micro_batch"] = largest_micro_batch(row["fit"], budget_gb * 1024)
    row["fits_budget_at_smallest"] = bool(row["points"]) and row["points"][0][memory_key] <= budget_gb * 1024
    return row


def stress_table(cfg, model: Path, backend: str, rank_counts: list[int], micro_batches: list[int], budget_gb: float,
                 workdir: Path, progress=lambda message: None, only: list[str] | None = None) -> list[dict]:
    """The rows of `backend`'s strategies (those named in `only`, when given) on each rank count."""
    rows = []
    for strategy, keys in strategies(backend):
        if only is not None and strategy not in only:
            continue
        for ranks in rank_counts:
            progress(f"stress: {strategy} on {ranks} rank(s), micro-batches {micro_batches}")
            rows.append(run_cell(cfg, model, strategy, keys, ranks, micro_batches, budget_gb, workdir))
    return rows
