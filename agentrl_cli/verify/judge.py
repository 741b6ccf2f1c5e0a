"""Judgements shared by `agentrl verify`, stage 8 and the run diagnosis: small pure functions over
lists of numbers, each returning (ok, measured) so the caller names the check.

Belongs here: trend and stability tests (reward slope with a confidence bound, entropy trend,
gradient-norm stability), the achievable maximum reward from the reward weights, and drift against
a baseline. Not here: reading runs (`record.py`) or building checks (the layer modules).
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
