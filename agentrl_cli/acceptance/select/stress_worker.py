"""One cell of the parallel-strategy stress table: one process (one rank) or one of the ranks torchrun
starts, building the training backend through the registry (`backend_class`) as a run's ranks do,
then, after one untimed warm-up step, training on micro-batches of increasing size and recording,
after each size, the peak memory above this process's baseline and the step time. `stress.py` starts it and reads the results.

    python -m agentrl_cli.acceptance.select.stress_worker --spec SPEC.json
    python -m torch.distributed.run --nproc_per_node 2 ... -m agentrl_cli.acceptance.select.stress_worker --spec SPEC.json

Memory: the peak resident set (`peak_rss_mib`: VmHWM of /proc/self/status) minus its value after
the imports (torch, the backend's module), so what is counted is what the model, the optimizer
state and the step allocate; on a GPU also `torch.cuda.max_memory_allocated`. The peak never goes
down, so the sizes run in increasing order and each reading is that size's peak (or an earlier
size's, when it was higher). Each rank writes `<out>/rank-<rank>.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

PROMPT_FRACTION = 0.5  # the first half of each sample is prompt (mask 0), the rest completion (mask 1)


def peak_rss_mib() -> float:
    """This process's peak resident set in MiB: VmHWM of /proc/self/status, which starts afresh at
    exec. (`getrusage(RUSAGE_SELF).ru_maxrss` is kept across exec on Linux, so a worker started by
    a large process would read its parent's peak; it is the fallback where /proc is missing.)"""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def samples(n: int, seq_len: int, vocab: int, seed: int) -> list:
    import numpy as np

    from agentrl_cli.learner.grpo import Sample

    rng = np.random.default_rng(seed)
    prompt = int(seq_len * PROMPT_FRACTION)
    out = []
    for i in range(n):
        ids = rng.integers(5, max(6, vocab - 1), size=seq_len).tolist()
        out.append(Sample(token_ids=ids, loss_mask=[0] * prompt + [1] * (seq_len - prompt),
                          logprobs=[-1.0] * seq_len, advantage=1.0 if i % 2 == 0 else -1.0))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stress_worker", description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", type=Path, required=True, help="JSON: model, training, micro_batches, seq_len, steps, out")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    spec = json.loads(args.spec.read_text(encoding="utf-8"))
    rank = int(os.environ.get("RANK", "0"))

    import torch

    from agentrl_cli.config.models import TrainingConfig
    from agentrl_cli.learner.backend import backend_class

    config = TrainingConfig.model_validate(spec["training"])
    cls = backend_class(config)  # imports the backend's module (DeepSpeed, FSDP) before the baseline
    cuda = torch.cuda.is_available()
    baseline = peak_rss_mib()
    vocab = json.loads((Path(spec["model"]) / "config.json").read_text(encoding="utf-8")).get("vocab_size", 256)
    result = {"rank": rank, "baseline_rss_mib": round(baseline, 1), "points": [], "memory": "rss"}
    started = time.perf_counter()
    backend = cls(spec["model"], config)
    try:
        result["build_s"] = round(time.perf_counter() - started, 3)
        result["after_build_mib"] = round(peak_rss_mib() - baseline, 1)
        backend.train_step(samples(spec["micro_batches"][0], spec["seq_len"], vocab, seed=7))  # warm-up, not timed
        for mbs in spec["micro_batches"]:
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            times = []
            for step in range(spec["steps"]):
                batch = samples(mbs, spec["seq_len"], vocab, seed=1000 * mbs + step)
                t0 = time.perf_counter()
                metrics = backend.train_step(batch)
                times.append(time.perf_counter() - t0)
            point = {"mbs": mbs, "peak_mib": round(peak_rss_mib() - baseline, 1), "step_s": round(min(times), 4),
                     "loss": float(metrics["loss"])}
            if cuda:
                point["cuda_peak_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
            result["points"].append(point)
    except Exception as exc:  # noqa: BLE001 - the size that did not fit (or the error) is part of the result
        result["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        backend.close()
    out = Path(spec["out"])
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank-{rank}.json").write_text(json.dumps(result) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
