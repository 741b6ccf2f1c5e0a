"""A trainer rank on deterministic synthetic samples, for multi-rank checks of the trainer backends.

    torchrun --nproc_per_node 2 --master_addr 127.0.0.1 --master_port 29511 \\
        tests/integration/ds_worker.py --model DIR --steps 3 --out ranks.json [--backend fsdp]

Each rank trains on its own shard of synthetic GRPO samples (prompt tokens, model tokens and a
masked tool-output span), so identical parameters on every rank afterwards prove that gradients
were averaged across ranks. Rank 0 writes one JSON file: per rank, the metrics of every step and a
sha256 of all parameter values. Also accepts the `deepspeed` launcher (`--local_rank`).

What belongs here: the synthetic data and the per-rank report. No training logic of its own.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
from pathlib import Path

import numpy as np

from agentrl_cli.config.models import TrainingConfig
from agentrl_cli.learner.grpo import Sample, group_advantages


def synthetic_samples(rank: int, step: int, count: int, vocab: int, seed: int = 0, length: int | None = None) -> list[Sample]:
    """`count` samples for (rank, step), the same every run: pairs share a group, one of each pair
    failed (reward 0) and one succeeded (reward 1), so every step carries a learning signal.
    `length` fixes every sample's length (equal token counts per rank: comparable to one rank)."""
    rng = np.random.default_rng([seed, rank, step])
    rewards: list[float | None] = [float(i % 2) for i in range(count)]
    groups = [f"r{rank}s{step}g{i // 2}" for i in range(count)]
    advantages = group_advantages(rewards, groups)
    samples = []
    for adv in advantages:
        n = int(rng.integers(12, 25)) if length is None else length
        ids = rng.integers(0, vocab, size=n)
        mask = np.zeros(n, dtype=np.int8)
        mask[4:] = 1                      # prompt: first 4 tokens
        mask[n // 2:n // 2 + 3] = 0       # a tool-output span inside the episode
        logprobs = np.where(mask == 1, -math.log(vocab) + rng.normal(0, 0.1, n), 0.0).astype(np.float32)
        samples.append(Sample(ids, mask, logprobs, adv))
    return samples


def parameter_digest(backend) -> str:
    """sha256 over every parameter's values, in name order."""
    names = sorted(name for name, _ in backend.module.named_parameters())
    values = backend.named_parameter_sample(names, sys.maxsize)
    digest = hashlib.sha256()
    for name in names:
        digest.update(name.encode())
        digest.update(np.asarray(values[name], dtype=np.float32).tobytes())
    return digest.hexdigest()


def run(model: Path, steps: int, out: Path, config: TrainingConfig, samples_per_rank: int, length: int | None = None) -> dict:
    import torch

    from agentrl_cli.learner.backend import backend_class

    backend = backend_class(config)(model, config)
    try:
        vocab = len(backend.tokenizer)
        initial = parameter_digest(backend)
        history = [backend.train_step(synthetic_samples(backend.rank, step, samples_per_rank, vocab, config.seed, length))
                   for step in range(steps)]
        mine = {"rank": backend.rank, "metrics": history, "param_sha256": parameter_digest(backend), "param_sha256_initial": initial,
                "optimizer_steps": backend.step}
        ranks: list = [None] * backend.world_size
        torch.distributed.all_gather_object(ranks, mine)
        report = {"world_size": backend.world_size, "steps": steps, "backend": config.backend, "zero_stage": config.zero_stage,
                  "ranks": ranks}
        if backend.rank == 0:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        torch.distributed.barrier()  # every rank tears its group down together, none while a peer still writes
        return report
    finally:
        backend.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ds_worker.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="Hugging Face model directory to train")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps")
    parser.add_argument("--out", type=Path, required=True, help="JSON report written by rank 0")
    parser.add_argument("--zero-stage", type=int, default=2, choices=range(4), help="DeepSpeed ZeRO stage")
    parser.add_argument("--micro-batch-size", type=int, default=2, help="samples per forward pass")
    parser.add_argument("--samples-per-rank", type=int, default=4, help="samples per rank per step")
    parser.add_argument("--lr", type=float, default=1e-3, help="learning rate")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic data")
    parser.add_argument("--length", type=int, default=None, help="fix every sample's length (default: 12-24 tokens)")
    parser.add_argument("--backend", default="deepspeed", help="training.backend (deepspeed, fsdp)")
    parser.add_argument("--dist-backend", default="gloo", choices=["auto", "gloo", "nccl"], help="collective backend")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    config = TrainingConfig(zero_stage=args.zero_stage, micro_batch_size=args.micro_batch_size, learning_rate=args.lr,
                            seed=args.seed, dist_backend=args.dist_backend, backend=args.backend)
    run(args.model, args.steps, args.out, config, args.samples_per_rank, args.length)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # the report is written and every rank passed the barrier: skip the interpreter's teardown, where a
    # collective library's background thread can abort the process under heavy load
    os._exit(code)
