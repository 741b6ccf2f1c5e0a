"""Supervised warm start: next-token loss on the assistant's tokens of the demonstrations only."""

from __future__ import annotations

import math
import random
import time
from typing import Callable

import torch

from agentrl_cli.model.demos import tokenize

IGNORE = -100


def make_examples(tokenizer, demos: list[dict], max_len: int) -> list[tuple[list[int], list[int]]]:
    return [ex for ex in (tokenize(tokenizer, d, max_len) for d in demos) if ex is not None]


def batches(examples, batch_size: int, pad_id: int, rng: random.Random):
    """Endless shuffled batches, right-padded: (input_ids, attention_mask, labels)."""
    while True:
        order = list(range(len(examples)))
        rng.shuffle(order)
        for i in range(0, len(order) - batch_size + 1, batch_size):
            chunk = [examples[j] for j in order[i:i + batch_size]]
            width = max(len(ids) for ids, _ in chunk)
            ids = torch.full((batch_size, width), pad_id, dtype=torch.long)
            att = torch.zeros((batch_size, width), dtype=torch.long)
            labels = torch.full((batch_size, width), IGNORE, dtype=torch.long)
            for r, (x, m) in enumerate(chunk):
                ids[r, :len(x)] = torch.tensor(x)
                att[r, :len(x)] = 1
                labels[r, :len(x)] = torch.tensor([t if keep else IGNORE for t, keep in zip(x, m)])
            yield ids, att, labels


def train_sft(model, tokenizer, demos: list[dict], steps: int, batch_size: int = 8, lr: float = 3e-3, seed: int = 0,
              max_len: int = 1024, progress: Callable[[int, float], None] = lambda step, loss: None) -> dict:
    torch.manual_seed(seed)
    examples = make_examples(tokenizer, demos, max_len)
    if len(examples) < batch_size:
        raise ValueError(f"only {len(examples)} demonstrations fit in {max_len} tokens; need at least {batch_size}")
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.95))
    warmup = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / max(1, steps)))))
    losses, t0 = [], time.perf_counter()
    data = batches(examples, batch_size, tokenizer.pad_token_id, random.Random(seed))
    for step in range(steps):
        ids, att, labels = next(data)
        loss = model(input_ids=ids, attention_mask=att, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        progress(step + 1, losses[-1])
    model.eval()
    tail = losses[-max(1, steps // 10):]
    return {"steps": steps, "batch_size": batch_size, "lr": lr, "examples": len(examples), "first_loss": losses[0],
            "final_loss": sum(tail) / len(tail), "seconds": round(time.perf_counter() - t0, 1)}
