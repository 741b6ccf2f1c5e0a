"""Seconds of a train step's phases (forward, backward, optimizer), summed over its micro-batches,
for the step's breakdown (`train/forward_s`, `train/backward_s`, `train/optimizer_s`).

On the CPU a mark is the wall clock. On a CUDA device a mark is an event recorded on the current
stream, so timing adds no synchronisation inside the step: the spans are read once, in `seconds()`,
after the step's last kernel is queued (waiting for it there moves the wait, it adds none).
Forward counts the pi_old pass, the policy's and the KL reference's log-probs and the loss; the
optimizer counts the engine's step (gradient clipping included) and the micro-batch's bookkeeping.
"""

from __future__ import annotations

import time

import torch

PHASES = ("forward", "backward", "optimizer")


class StepClock:
    def __init__(self, device) -> None:
        self.cuda = torch.device(device).type == "cuda"
        self._spans: list[tuple[str, object, object]] = []

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def span(self, phase: str, start):
        """Close the span of `phase` begun at `start`; returns the mark that ends it (the next span's start)."""
        end = self.mark()
        self._spans.append((phase, start, end))
        return end

    def seconds(self) -> dict[str, float]:
        """{"forward_s", "backward_s", "optimizer_s"}: each phase's spans summed."""
        out = dict.fromkeys(PHASES, 0.0)
        if self.cuda and self._spans:
            self._spans[-1][2].synchronize()
        for phase, start, end in self._spans:
            out[phase] += start.elapsed_time(end) / 1000.0 if self.cuda else end - start
        return {f"{phase}_s": round(value, 6) for phase, value in out.items()}
