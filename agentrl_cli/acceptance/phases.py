"""Where a step's time goes, phase by phase, beside each phase's lower bound on this machine: the
per-step breakdown stage 0 reports (`baseline.json`'s `phases`) and `benchmarks/peer_trl.py`
prints for both systems.

A step's phases:
- on the trainer's path, adding up to the step's wall time: `trainer_idle` (waiting for samples;
  in sync mode the whole generation), `forward`, `backward`, `optimizer` (the learner's own timers,
  `learner/step_clock.py`), `train_rest` (the train step less those three: collating, moving
  tensors), `weight_sync`, `checkpoint`, and `other` (what no timer covers: the unaccounted time);
- beside it, on the inference servers (their own counters, summed over servers, over the same
  window): `prefill` and `decode` (with tokens and batch occupancy: mean rows per decode step against
  `max_batch_size`), `server_rest` (busy in neither: merging, bookkeeping) and `server_idle` (the
  window less the busy time: the servers waiting while the trainer trains); and `scoring` (reward
  time, summed over the step's episodes, so episodes scored at once count each).

Lower bounds (`bound_s`), from model FLOPs (`gemm_rate.model_flops`: N matmul weights, N_A adapter
weights) at the GEMM rate measured in the same run: prefill 2(N+N_A) per computed prompt token;
decode the tokens at the GEMM-bound decode rate of the step's mean occupancy (`gemm_rate.decode_bound`:
the model's multiplies at that many rows) or at the flat rate, whichever is lower (the first alone
beside it, `bound_at_rows_s`); forward
2(N+N_A) and backward (4N+6N_A with LoRA, 6N without, less the forward) per trained token
(`train/sequence_tokens`: every trained sequence whole; the trainer runs a group's shared prompt
once, so this bound counts more work than it does and its ratio reads low). Phases without model FLOPs (scoring, optimizer, sync, idle) have none.
`ratio` = seconds / bound: 1 is the machine's limit. Figures, not judged.
"""

from __future__ import annotations

import statistics
from typing import Callable

from agentrl_cli.runtime.observe import keys

PATH = ("trainer_idle", "forward", "backward", "optimizer", "train_rest", "weight_sync", "checkpoint", "other")
BESIDE = ("prefill", "decode", "server_rest", "server_idle", "scoring")
SERVER_COUNTERS = ("busy_seconds_total", "prefill_seconds_total", "prefill_tokens_total", "decode_seconds_total",
                   "decode_tokens_total", "decode_steps_total", "decode_rows_total")


def lower_bound_s(flop: float, flops_per_s: float | None) -> float | None:
    """Seconds `flop` model FLOPs take at `flops_per_s` (None when the rate is unknown or zero)."""
    return flop / flops_per_s if flops_per_s else None


def ratio(seconds: float | None, bound_s: float | None) -> float | None:
    """seconds / bound (None without a positive bound)."""
    return round(seconds / bound_s, 3) if seconds is not None and bound_s else None


def phase(seconds: float | None, bound_s: float | None = None, **extra) -> dict:
    out = {"s": round(seconds, 4) if seconds is not None else None}
    if bound_s is not None:
        out.update(bound_s=round(bound_s, 5), ratio=ratio(seconds, bound_s))
    return {**out, **extra}


def occupancy(server: dict) -> float | None:
    """Mean rows of a decode step (None when no step ran)."""
    steps = server.get("decode_steps_total") or 0
    return server.get("decode_rows_total", 0) / steps if steps else None


def server_delta(before: list[dict | None], after: list[dict | None]) -> dict | None:
    """The counters' growth between two readings of every server, summed (None when a server reported none)."""
    if not before or any(b is None for b in before) or any(a is None for a in after):
        return None
    return {k: sum(a[k] - b[k] for a, b in zip(after, before)) for k in SERVER_COUNTERS}


def server_counters(server_info: dict) -> dict | None:
    """SERVER_COUNTERS from a `/server_info` answer (the embedded engine's internal_states), None when absent."""
    states = (server_info.get("internal_states") if isinstance(server_info, dict) else None) or [{}]
    state = states[0] if isinstance(states[0], dict) else {}
    if any(not isinstance(state.get(k), (int, float)) for k in SERVER_COUNTERS):
        return None
    return {k: state[k] for k in SERVER_COUNTERS}


class Rates:
    """This machine's rates for the bounds: `gemm_flops` (FLOP/s), the model's `flops` per token
    (`gemm_rate.model_flops`), and `decode_rate(batch)` (GEMM-bound decode tokens/s at `batch` rows;
    None: decode is bound at the flat GEMM rate)."""

    def __init__(self, gemm_flops: float | None, flops: dict | None, decode_rate: Callable[[int], float] | None = None) -> None:
        self.gemm_flops, self.flops, self.decode_rate = gemm_flops, flops, decode_rate

    def tokens(self, tokens: float, per: str) -> float | None:
        return lower_bound_s(tokens * self.flops[per], self.gemm_flops) if self.flops else None

    def backward(self, tokens: float) -> float | None:
        if not self.flops:
            return None
        return lower_bound_s(tokens * (self.flops["per_trained_token"] - self.flops["per_generated_token"]), self.gemm_flops)

    def decode(self, tokens: float, rows: float | None) -> float | None:
        """The lower of the two bounds: the tokens at the decode rate of `rows` rows, and their FLOPs at the
        GEMM rate (the timed multiplies carry per-call overhead, which a small model or a loaded machine
        can make larger than the engine's own step)."""
        flat, at_rows = self.tokens(tokens, "per_generated_token"), self.decode_at_rows(tokens, rows)
        return min((b for b in (flat, at_rows) if b is not None), default=None)

    def decode_at_rows(self, tokens: float, rows: float | None) -> float | None:
        """The tokens at the GEMM-bound decode rate of `rows` rows alone (None where not measured; 0 for none)."""
        if not tokens:
            return 0.0 if self.decode_rate is not None else None
        rate = self.decode_rate(max(1, round(rows))) if self.decode_rate is not None and rows else None
        return tokens / rate if rate else None


def step_phases(row: dict, server: dict | None, window_s: float | None, rates: Rates, max_batch_size: int | None = None) -> dict:
    """One step's breakdown from its metrics row, the servers' counter growth over `window_s`
    seconds of wall time around it (`server_delta`; None: no server counters) and `rates`."""
    def t(part: str) -> float:
        return float(row.get(keys.time_part(part)) or 0.0)

    step_s = t("step_s") or (t("wait_s") + t("train_s") + t("sync_s"))
    train_s = t("train_s")
    forward, backward, optimizer = (row.get(k) for k in (keys.TRAIN_FORWARD_S, keys.TRAIN_BACKWARD_S, keys.TRAIN_OPTIMIZER_S))
    learner = sum(x for x in (forward, backward, optimizer) if x is not None)
    trained = float(row.get(keys.TRAIN_SEQUENCE_TOKENS) or 0)
    path = {"trainer_idle": phase(t("wait_s") or row.get(keys.TIME_SAMPLING_WAIT_S)),
            "forward": phase(forward, rates.tokens(trained, "per_generated_token") if forward is not None else None),
            "backward": phase(backward, rates.backward(trained) if backward is not None else None),
            "optimizer": phase(optimizer),
            "train_rest": phase(max(0.0, train_s - learner)),
            "weight_sync": phase(t("sync_s")), "checkpoint": phase(t("checkpoint_s")), "other": phase(t("other_s"))}
    beside = {"scoring": phase(t("reward_s"))}
    tokens = {"trained": int(trained)}
    if server is not None:
        rows = occupancy(server)
        busy = server["busy_seconds_total"]
        gen = server["prefill_seconds_total"] + server["decode_seconds_total"]
        beside.update(
            prefill=phase(server["prefill_seconds_total"], rates.tokens(server["prefill_tokens_total"], "per_generated_token"),
                          tokens=server["prefill_tokens_total"]),
            decode=phase(server["decode_seconds_total"], rates.decode(server["decode_tokens_total"], rows),
                         bound_at_rows_s=_round(rates.decode_at_rows(server["decode_tokens_total"], rows)),
                         tokens=server["decode_tokens_total"], steps=server["decode_steps_total"],
                         occupancy=round(rows, 2) if rows is not None else None, max_batch_size=max_batch_size),
            server_rest=phase(max(0.0, busy - gen)),
            server_idle=phase(max(0.0, window_s - busy) if window_s is not None else None, window_s=window_s))
        tokens.update(prefill=server["prefill_tokens_total"], decode=server["decode_tokens_total"])
    return {"step_s": round(step_s, 4), "path": path, "beside": beside, "tokens": tokens,
            "unaccounted_s": path["other"]["s"]}


def _round(value: float | None, digits: int = 5) -> float | None:
    return round(value, digits) if value is not None else None


EXTRAS = ("tokens", "occupancy", "bound_at_rows_s")  # averaged over the steps that have them


def mean_phases(steps: list[dict]) -> dict:
    """Mean over `steps` (step_phases, or any {"step_s", "path", "beside"} of `phase`s) of each phase's
    seconds, bound and ratio (of the means)."""
    if not steps:
        return {}
    out: dict = {"step_s": round(statistics.fmean(s["step_s"] for s in steps), 4)}
    for side in ("path", "beside"):
        out[side] = {}
        for name in dict.fromkeys(n for s in steps for n in s.get(side, {})):  # in the steps' order
            got = [s[side][name] for s in steps if name in s.get(side, {}) and s[side][name]["s"] is not None]
            if not got:
                continue
            seconds = statistics.fmean(p["s"] for p in got)
            bounds = [p["bound_s"] for p in got if p.get("bound_s") is not None]
            bound = statistics.fmean(bounds) if len(bounds) == len(got) else None
            extra = {k: statistics.fmean(p[k] for p in got if p.get(k) is not None) for k in EXTRAS
                     if any(p.get(k) is not None for p in got)}
            out[side][name] = phase(seconds, bound, **{k: round(v, 5 if k.endswith("_s") else 2) for k, v in extra.items()})
    return out


def table(breakdown: dict, title: str) -> list[str]:
    """Lines of a printed breakdown (`mean_phases`): phase, seconds, bound, ratio."""
    lines = [f"{title}: {breakdown.get('step_s')} s per step"]
    for side, label in (("path", "on the trainer's path"), ("beside", "beside it")):
        if not breakdown.get(side):
            continue
        lines.append(f"  {label}:")
        for name, p in breakdown.get(side, {}).items():
            bound = f"  bound {p['bound_s']:.4f} s  x{p['ratio']}" if p.get("bound_s") is not None else ""
            more = "".join(f"  {k.removesuffix('_s').replace('_', ' ')} {p[k]}" for k in EXTRAS if k in p)
            lines.append(f"    {name:12} {p['s']:.4f} s{bound}{more}")
    return lines


def compact(breakdown: dict) -> dict[str, str]:
    """A breakdown (`mean_phases`) as one line per phase: "seconds [bound, ratio] [tokens, occupancy]"."""
    out = {"step": f"{breakdown.get('step_s')} s"}
    for side in ("path", "beside"):
        for name, p in breakdown.get(side, {}).items():
            text = f"{p['s']:.4f} s"
            if p.get("bound_s") is not None:
                text += f", bound {p['bound_s']:.4f} s, x{p['ratio']}"
            text += "".join(f", {k.removesuffix('_s').replace('_', ' ')} {p[k]}" for k in EXTRAS if k in p)
            out[name] = text
    return out
