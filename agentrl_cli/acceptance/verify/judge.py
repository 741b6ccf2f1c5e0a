"""Judgements shared by `agentrl verify`, stage 8 and the run diagnosis: small pure functions over
lists of numbers, each returning (ok, measured) so the caller names the check.

Belongs here: trend and stability tests (reward slope and evaluation curve with a confidence
bound, entropy trend, gradient-norm stability, a held-out harness falling behind), the achievable
maximum reward from the reward weights, and drift against a baseline. Not here: reading runs (`record.py`) or building checks (the layer modules).
"""

from __future__ import annotations

import math
import statistics

# two-sided 90% Student-t quantiles (a one-sided 95% lower bound) for small samples; 1.645 beyond
_T95 = {1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 7: 1.895, 8: 1.860, 9: 1.833, 10: 1.812,
        12: 1.782, 15: 1.753, 20: 1.725, 30: 1.697, 60: 1.671}


def _t95(dof: int) -> float:
    if dof <= 0:
        return math.inf
    keys = [k for k in sorted(_T95) if k <= dof]
    return _T95[keys[-1]] if dof <= 60 else 1.645


def _r(x: float | None, digits: int = 4) -> float | None:
    return None if x is None or not math.isfinite(x) else round(x, digits)


def slope_with_bound(ys: list[float], xs: list[float] | None = None) -> dict:
    """Least-squares slope of `ys` over `xs` (default 0..n-1) with its one-sided 95% lower and upper
    bounds (Student t on the slope's standard error). Needs 3 points; fewer give None bounds."""
    n = len(ys)
    xs = list(range(n)) if xs is None else list(xs)
    if n < 3:
        return {"slope": None, "lower": None, "upper": None, "n": n}
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return {"slope": None, "lower": None, "upper": None, "n": n}
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    resid = sum((y - my - slope * (x - mx)) ** 2 for x, y in zip(xs, ys))
    se = math.sqrt(resid / (n - 2) / sxx)
    t = _t95(n - 2)
    return {"slope": slope, "lower": slope - t * se, "upper": slope + t * se, "n": n}


def reward_rises(rewards: list[float]) -> tuple[bool, dict]:
    """The reward's slope per step is positive with 95% confidence (its lower bound above 0)."""
    fit = slope_with_bound(rewards)
    ok = fit["lower"] is not None and fit["lower"] > 0
    return ok, {"slope_per_step": _r(fit["slope"], 6), "lower_95": _r(fit["lower"], 6), "upper_95": _r(fit["upper"], 6),
                "steps": fit["n"], "first": _r(rewards[0]) if rewards else None, "last": _r(rewards[-1]) if rewards else None}


def eval_rises(curve: list[tuple[int, int, int]]) -> tuple[bool, dict]:
    """Greedy evaluation success rises with 95% confidence: a least-squares line through every
    evaluated episode (1 solved, 0 not) against the step it was evaluated at, its slope's lower bound
    above 0. `curve`: [(step, solved, episodes)] per evaluation, oldest first."""
    xs = [step for step, _, n in curve for _ in range(n)]
    ys = [1.0 if i < solved else 0.0 for _, solved, n in curve for i in range(n)]
    fit = slope_with_bound(ys, xs)
    ok = fit["lower"] is not None and fit["lower"] > 0
    rate = [round(solved / n, 3) if n else None for _, solved, n in curve]
    return ok, {"slope_per_100_steps": _r(fit["slope"] * 100 if fit["slope"] is not None else None),
                "lower_95": _r(fit["lower"] * 100 if fit["lower"] is not None else None),
                "evaluations": [{"step": s, "success_rate": r} for (s, _, _), r in zip(curve, rate)], "episodes": len(ys)}


def gap_widening(train: list[tuple[float, float]], held: tuple[float, float]) -> dict:
    """How far a held-out harness fell behind the training harnesses during training: the training
    harnesses' mean gain minus the held-out harness's gain (before, after pairs). A gap that existed
    before training (a harness the model never learned) is not counted; a held-out harness that
    declines while the others hold counts in full. `measurable` is False when the held-out harness
    scored 0 before and after: a model that never solves it shows nothing about transfer."""
    train_before = statistics.fmean(b for b, _ in train)
    train_after = statistics.fmean(a for _, a in train)
    drop = (train_after - train_before) - (held[1] - held[0])
    return {"training_before": round(train_before, 3), "training_after": round(train_after, 3),
            "held_out_before": round(held[0], 3), "held_out_after": round(held[1], 3), "drop": round(drop, 3),
            "measurable": held[0] > 0 or held[1] > 0}


UNMEASURABLE = ("{name} scored 0 before and after training: a model that never solves it shows nothing about "
                "transfer; hold out a harness the model solves sometimes (harnesses[].held_out), or warm-start "
                "the model on its interface")


def entropy_trend(entropy: list[float]) -> tuple[bool, dict]:
    """(ok, measured): the median entropy of the last window within 0.1x-10x of the first window's;
    a window is a tenth of the steps, at least 5. One step's entropy depends on which tasks the
    curriculum drew (seen: 0.23 and 0.01 four steps apart), so the trend is judged on medians, not
    on two single steps. No entropy logged is not ok."""
    if not entropy:
        return False, {"first": None, "last": None, "window_steps": 0}
    window = min(len(entropy), max(5, len(entropy) // 10))
    first, last = statistics.median(entropy[:window]), statistics.median(entropy[-window:])
    return 0.1 * first < last < 10 * max(first, 1e-6), {"first": _r(first), "last": _r(last), "window_steps": window}


def grad_norm_stable(norms: list[float]) -> tuple[bool, dict]:
    """Every gradient norm finite and none above 100x the median."""
    if not norms:
        return False, {"median": None, "max": None, "steps": 0}
    finite = all(math.isfinite(x) for x in norms)
    med = statistics.median(norms) if finite else math.nan
    ok = finite and max(norms) <= 100 * max(med, 1e-6)
    return ok, {"median": _r(med), "max": _r(max(norms)) if finite else "not finite", "steps": len(norms)}


def achievable_max_reward(weights: dict[str, float]) -> float:
    """The highest reward the aggregation can give: every component lies in [0, 1], so each
    positive weight adds at most itself and a negative weight (a penalty) at best nothing."""
    return sum(max(w, 0.0) for w in weights.values())


def relative_drift(value: float, baseline: float, floor: float = 1e-9) -> float:
    """(value - baseline) / baseline, with the baseline floored so a zero baseline stays finite."""
    return (value - baseline) / max(abs(baseline), floor)
