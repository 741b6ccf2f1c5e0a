"""The run report's figures, drawn with matplotlib (Agg, no display) and returned as base64 PNG data
URIs so the HTML needs no other file and no network. One function per figure; each takes plain
series (lists of numbers) and draws "no data recorded" when it has none, so an older run's report
still has every figure. Belongs here: drawing; finding the series belongs to `run_report.py`.
"""

from __future__ import annotations

import base64
import io

from matplotlib.figure import Figure

SIZE = (7.0, 3.2)
DPI = 80
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


def data_uri(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _figure(title: str) -> tuple[Figure, object]:
    fig = Figure(figsize=SIZE)
    ax = fig.add_subplot()
    ax.set_title(title, fontsize=11)
    ax.grid(alpha=0.3)
    return fig, ax


def _empty(ax, why: str = "no data recorded in this run") -> None:
    ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes, color="#888")
    ax.set_xticks([])
    ax.set_yticks([])


def lines(title: str, series: dict[str, tuple[list, list]], xlabel: str = "step", ylabel: str = "",
          dashed: set[str] = frozenset()) -> tuple[str, bool]:
    """Line plot of named (x, y) series; names in `dashed` draw dashed. Returns (data URI, has data)."""
    fig, ax = _figure(title)
    drawn = 0
    for i, (name, (xs, ys)) in enumerate(series.items()):
        pts = [(x, y) for x, y in zip(xs, ys) if x is not None and y is not None]
        if not pts:
            continue
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=name, color=COLORS[i % len(COLORS)],
                linestyle="--" if name in dashed else "-", marker="o" if len(pts) < 30 else None, markersize=3)
        drawn += 1
    if drawn:
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8, loc="best")
    else:
        _empty(ax)
    return data_uri(fig), bool(drawn)


def stacked_shares(title: str, steps: list, shares: dict[str, list]) -> tuple[str, bool]:
    """Stacked areas of phase shares (each list aligned with `steps`, values 0..1, None = missing)."""
    fig, ax = _figure(title)
    keep = [i for i in range(len(steps)) if all(s[i] is not None for s in shares.values())]
    if keep:
        xs = [steps[i] for i in keep]
        ax.stackplot(xs, *[[s[i] for i in keep] for s in shares.values()], labels=list(shares), colors=COLORS[:len(shares)],
                     alpha=0.8)
        ax.set_ylim(0, 1)
        ax.set_xlabel("step")
        ax.set_ylabel("share of step time")
        ax.legend(fontsize=8, loc="upper right")
    else:
        _empty(ax)
    return data_uri(fig), bool(keep)


def histogram(title: str, samples: dict[str, list[float]], unit: str = "ms") -> tuple[str, bool]:
    """Overlaid histograms of named sample lists, with p50 and p99 in the legend."""
    fig, ax = _figure(title)
    drawn = 0
    for i, (name, values) in enumerate(samples.items()):
        values = sorted(v for v in values if v is not None)
        if not values:
            continue
        p50 = values[len(values) // 2]
        p99 = values[min(len(values) - 1, round(0.99 * (len(values) - 1)))]
        ax.hist(values, bins=min(40, max(5, len(values) // 3)), alpha=0.6, color=COLORS[i % len(COLORS)],
                label=f"{name} (n={len(values)}, p50 {p50:.1f}, p99 {p99:.1f} {unit})")
        drawn += 1
    if drawn:
        ax.set_xlabel(unit)
        ax.set_ylabel("count")
        ax.legend(fontsize=8, loc="best")
    else:
        _empty(ax)
    return data_uri(fig), bool(drawn)
