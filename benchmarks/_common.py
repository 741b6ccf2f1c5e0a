"""Shared helpers for the benchmark scripts: percentiles, a figure table, and the --json format
`{"figures": {NAME: {"value", "unit", "target", "met"}}}`."""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def figure(value: float, unit: str, target: str | None = None, met: bool | None = None) -> dict:
    return {"value": round(value, 4) if isinstance(value, float) else value, "unit": unit, "target": target, "met": met}


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--json", action="store_true", help="print one JSON object with the figures")
    return p


def report(figures: dict[str, dict], as_json: bool) -> int:
    if as_json:
        print(json.dumps({"figures": figures}, indent=2))
    else:
        width = max(len(k) for k in figures)
        for name, f in figures.items():
            target = f" (target {f['target']}: {'met' if f['met'] else 'NOT met'})" if f["target"] is not None else ""
            print(f"{name:<{width}}  {f['value']} {f['unit']}{target}")
    return 0 if all(f["met"] is not False for f in figures.values()) else 1


def default_model() -> Path:
    """The built-in model when it is cached (config defaults), else a random tiny model made here."""
    from agentrl_cli.config import load_config
    from agentrl_cli.core.errors import NotFoundError
    from agentrl_cli.model.resolve import resolve_model_path
    from agentrl_cli.model.tiny import build_random

    cfg = load_config(None, [], env={}).config
    try:
        return resolve_model_path(cfg.model.path, cfg.model.cache_dir, build=False)
    except NotFoundError:
        return build_random(Path(tempfile.mkdtemp(prefix="agentrl-bench-")) / "tiny", seed=0)
