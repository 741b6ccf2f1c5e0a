"""Draw a run's learning curve for the docs: greedy eval success per harness, token entropy (and the
adaptive entropy bonus when the run had one) and gradient norm by step, from the run's stage 8
metrics.jsonl, as one PNG.

    .venv/bin/python scripts/run_curve.py runs/<RUN_ID> docs/img/<name>.png [--floor 0.2] [--title TEXT]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from matplotlib.figure import Figure


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="run directory (with stage8/metrics.jsonl)")
    ap.add_argument("out", type=Path, help="PNG to write")
    ap.add_argument("--floor", type=float, default=None, help="entropy floor to draw (stages.full_min_entropy)")
    ap.add_argument("--title", default="", help="title above the figure")
    args = ap.parse_args()
    path = args.run / "stage8" / "metrics.jsonl"
    if not path.is_file():
        print(f"{path} does not exist: pass a run directory that ran stage 8", file=sys.stderr)
        return 2
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    evals: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        for k, v in r.items():
            if k.startswith("eval/") and k.endswith("/success_rate"):
                evals.setdefault(k[len("eval/"):-len("/success_rate")], []).append((r["step"], v))
    train = [r for r in rows if "train/entropy" in r]
    fig = Figure(figsize=(8.0, 7.0))
    ax1, ax2, ax3 = fig.subplots(3, 1, sharex=True)
    for name, points in evals.items():
        label = name.split(":")[-1] + (" (held out)" if ":" in name else "")
        ax1.plot(*zip(*points), marker="o", ms=3, label=label)
    ax1.set_ylabel("greedy eval success")
    ax1.set_ylim(-0.02, 1.02)
    ax1.legend(fontsize=8)
    steps = [r["step"] for r in train]
    ax2.plot(steps, [r["train/entropy"] for r in train], color="#2ca02c", label="token entropy (nats)")
    if args.floor is not None:
        ax2.axhline(args.floor, color="#d62728", ls="--", lw=1, label=f"floor {args.floor:g}")
    if any("train/entropy_coef" in r for r in train):
        twin = ax2.twinx()
        twin.plot(steps, [r.get("train/entropy_coef") for r in train], color="#9467bd", lw=1, label="entropy bonus")
        twin.set_ylabel("entropy bonus", color="#9467bd")
    ax2.set_ylabel("entropy")
    ax2.legend(fontsize=8, loc="upper right")
    ax3.plot(steps, [r["train/grad_norm"] for r in train], color="#8c564b")
    ax3.set_ylabel("gradient norm")
    ax3.set_xlabel("trainer step")
    for ax in (ax1, ax2, ax3):
        ax.grid(alpha=0.3)
    if args.title:
        fig.suptitle(args.title, fontsize=11)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=80)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
