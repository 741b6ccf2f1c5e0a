"""`agentrl troubleshoot --run RUN`: apply every knowledge-base entry's detectors to a run's records
(metrics, evaluations, baseline and probe, reports, stored trajectories) and rank the entries found
by the strength of their evidence. The config judged against is the one the run archived."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from agentrl_cli.acceptance.run_record import load_record
from agentrl_cli.acceptance.troubleshoot.detectors import DETECTORS, DiagnosedRun, Hit
from agentrl_cli.acceptance.troubleshoot.knowledge import Entry, KnowledgeBase, load_knowledge_base

log = logging.getLogger(__name__)


@dataclass
class Finding:
    entry: Entry
    strength: float
    hits: list[tuple[str, Hit]]

    def to_dict(self) -> dict:
        return {"id": self.entry.id, "symptom": self.entry.symptom.model_dump(), "strength": round(self.strength, 2),
                "evidence": [{"detector": kind, "summary": h.summary, "figures": h.evidence} for kind, h in self.hits],
                "actions": [a.model_dump() for a in self.entry.actions], "config_keys": self.entry.config_keys}


def run_config(run, fallback):
    """The config the run archived in meta.json, else `fallback`."""
    from agentrl_cli.config import PlatformConfig

    resolved = run.meta().get("config")
    if isinstance(resolved, dict):
        try:
            return PlatformConfig.model_validate(resolved)
        except ValueError as exc:
            log.warning("run %s: archived config does not load (%s); using the current one", run.run_id, exc)
    return fallback


def diagnose(run, config, kb: KnowledgeBase | None = None) -> list[Finding]:
    kb = kb or load_knowledge_base()
    data = DiagnosedRun(load_record(run), run_config(run, config))
    findings = []
    for entry in kb.entries:
        hits = []
        for spec in entry.detectors:
            thresholds = {k: v for k, v in spec.items() if k != "kind"}
            hit = DETECTORS[spec["kind"]](data, thresholds)
            if hit is not None:
                hits.append((spec["kind"], hit))
        if hits:
            findings.append(Finding(entry, max(h.strength for _, h in hits), hits))
    findings.sort(key=lambda f: -f.strength)
    return findings
