"""`agentrl verify`: the four-layer acceptance (seed 003 §8) plus the cross-harness check.

Layers: connectivity, correctness, performance against the stage-0 baseline, small-sample
convergence, and cross-harness (training harnesses beside a held-out one). Each layer reads what
the stages and the run recorded and measures what is missing. Until a layer is built it reports a
failing "not implemented" check.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Callable

from agentrl_cli.config import LoadedConfig
from agentrl_cli.report import FAIL, Check, apply_strict, stage_status
from agentrl_cli.rundir import RunDir, now_iso

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Layer:
    key: str
    title: str
    planned: str


LAYERS: tuple[Layer, ...] = (
    Layer("connectivity", "connectivity",
          "control plane reaches every worker; inference health checks pass; sandboxes create, execute and reclaim; storage reads and writes"),
    Layer("correctness", "correctness",
          "loss finite and of sane magnitude; reward distribution as the task expects (no mass of constant full marks); "
          "checkpoint written and resumed after interruption; reward variance of repeated runs acceptable"),
    Layer("performance", "performance against the stage-0 baseline",
          "tokens/s, samples/min, accelerator utilisation, sampling queue length, step time shares (sampling/training/sync), env failure rate"),
    Layer("convergence", "small-sample convergence",
          "short training run: reward curve rises, policy entropy neither collapses nor explodes, gradient norm stable"),
    Layer("cross_harness", "cross-harness",
          "scores on the training harnesses beside a held-out harness never trained on; a large drop means interface conventions were learned"),
)


@dataclass
class VerifyReport:
    status: str
    layers: dict[str, list]  # layer key -> list of Check (as dicts when serialised)
    started_at: str
    duration_s: float
    run_id: str
    config_hash: str

    def to_dict(self) -> dict:
        return {"schema_version": SCHEMA_VERSION, "kind": "verify", **asdict(self)}

    def checks(self) -> list[Check]:
        return [c for checks in self.layers.values() for c in checks]

    def to_markdown(self) -> str:
        out = [f"# agentrl verify — {self.status.upper()}", "", f"run `{self.run_id}` · config `{self.config_hash}`", ""]
        for layer in LAYERS:
            out += [f"## {layer.title}", "", "| check | status | measured | expected |", "|---|---|---|---|"]
            for c in self.layers.get(layer.key, []):
                out.append(f"| {c.name} | {c.status} | {c.measured if c.measured is not None else '—'} | {c.expected} |")
                if c.status == FAIL and c.hint:
                    out.append(f"|  | what to do: {c.hint} | | |")
            out.append("")
        return "\n".join(out)


def layer_checks(layer: Layer, loaded: LoadedConfig, run: RunDir) -> list[Check]:
    """The checks of one layer. Layers arrive with the runtime; until then: not implemented."""
    check = Check.not_implemented(layer.planned)
    check.name = f"{layer.key}: not implemented"
    return [check]


def verify(loaded: LoadedConfig, run: RunDir, strict: bool = False,
           progress: Callable[[str], None] = lambda message: None) -> VerifyReport:
    t0, started = time.perf_counter(), now_iso()
    layers: dict[str, list] = {}
    for layer in LAYERS:
        progress(layer.title)
        checks = layer_checks(layer, loaded, run)
        layers[layer.key] = apply_strict(checks) if strict else checks
    flat = [c for cs in layers.values() for c in cs]
    return VerifyReport(status=stage_status(flat), layers=layers, started_at=started,
                        duration_s=round(time.perf_counter() - t0, 3), run_id=run.run_id, config_hash=loaded.hash)
