"""How well a reward model separates and calibrates, measured on held-out tasks (numpy only).

- `auc`: the ROC AUC as the Mann-Whitney statistic (ties count one half), from average ranks.
- `auc_ci`: a percentile bootstrap over TASKS: each resample draws held-out tasks with replacement
  and takes all their trajectories (trajectories of one task are not independent); resamples with a
  single class are skipped and counted.
- `reliability`: equal-width bins of the predicted probability with their counts, mean prediction
  and observed success rate; `ece` is the count-weighted mean gap between the two.
- `brier`: the mean squared error of the probabilities.
"""

from __future__ import annotations

import numpy as np


def auc(scores, labels) -> float | None:
    """P(score of a success > score of a failure) + 1/2 P(tie); None without both classes."""
    s, y = np.asarray(scores, dtype=float), np.asarray(labels, dtype=int)
    n_pos, n_neg = int(y.sum()), int(len(y) - y.sum())
    if n_pos == 0 or n_neg == 0:
        return None
    _, inverse, counts = np.unique(s, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    average_rank = ends - (counts - 1) / 2.0  # 1-based average rank of each distinct value
    ranks = average_rank[inverse]
    return float((ranks[y == 1].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def auc_ci(scores, labels, groups, *, resamples: int = 2000, level: float = 0.95, seed: int = 0) -> dict:
    """{"low", "high", "resamples", "skipped"}: the percentile interval of the AUC over bootstrap
    resamples of the groups (tasks)."""
    s, y, g = np.asarray(scores, dtype=float), np.asarray(labels, dtype=int), np.asarray(groups)
    names = sorted(set(g.tolist()))
    members = [np.flatnonzero(g == name) for name in names]
    rng = np.random.default_rng(seed)
    values, skipped = [], 0
    for _ in range(resamples):
        picked = np.concatenate([members[i] for i in rng.integers(0, len(names), len(names))])
        value = auc(s[picked], y[picked])
        if value is None:
            skipped += 1
        else:
            values.append(value)
    if not values:
        return {"low": None, "high": None, "resamples": resamples, "skipped": skipped}
    alpha = (1.0 - level) / 2.0
    low, high = np.quantile(values, [alpha, 1.0 - alpha])
    return {"low": float(low), "high": float(high), "resamples": resamples, "skipped": skipped}


def reliability(probs, labels, bins: int = 10) -> list[dict]:
    """One row per non-empty bin: its range, count, mean predicted probability, observed success rate."""
    p, y = np.asarray(probs, dtype=float), np.asarray(labels, dtype=int)
    edges = np.linspace(0.0, 1.0, bins + 1)
    which = np.clip(np.digitize(p, edges[1:-1], right=False), 0, bins - 1)
    rows = []
    for b in range(bins):
        m = which == b
        if m.any():
            rows.append({"low": float(edges[b]), "high": float(edges[b + 1]), "count": int(m.sum()),
                         "mean_predicted": float(p[m].mean()), "observed": float(y[m].mean())})
    return rows


def ece(probs, labels, bins: int = 10) -> float:
    rows = reliability(probs, labels, bins)
    total = sum(r["count"] for r in rows)
    return float(sum(r["count"] * abs(r["mean_predicted"] - r["observed"]) for r in rows) / total) if total else 0.0


def brier(probs, labels) -> float:
    p, y = np.asarray(probs, dtype=float), np.asarray(labels, dtype=float)
    return float(np.mean((p - y) ** 2)) if len(p) else 0.0
