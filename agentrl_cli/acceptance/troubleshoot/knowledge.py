"""The knowledge base and symptom lookup, in English or Chinese.

The knowledge base is data (`knowledge_base.yaml`): every symptom from the seed documents'
troubleshooting tables and the verification failures of the runbook, each with causes, how to
check and what to do, in both languages, the signals that show it and the detectors that look for
it in a run. Lookup ranks entries by BM25 over their whole text and a fuzzy match of their symptom
and aliases (`search.py`); a match is confident when its score clears MATCH_CUTOFF.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

import yaml
from pydantic import BaseModel, ConfigDict, Field
from agentrl_cli.acceptance.troubleshoot.search import Index, fuzzy

MATCH_CUTOFF = 50.0  # below this a query "does not match" and the closest entries are listed
COVERAGE_SCALE = 175.0  # coverage (0..1) to points: an entry covering 30% of a query's weight scores about 50
FUZZY_MIN = 75.0  # a fuzzy match of a phrase counts only when this close: looser ones are noise


class Text(BaseModel):
    model_config = ConfigDict(extra="forbid")
    en: str = Field(min_length=1)
    zh: str = Field(min_length=1)


class Aliases(BaseModel):
    model_config = ConfigDict(extra="forbid")
    en: list[str] = Field(default_factory=list)
    zh: list[str] = Field(default_factory=list)


class Entry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str
    source: list[str]
    stages: list[int] = Field(default_factory=list)
    layers: list[str] = Field(default_factory=list)
    symptom: Text
    aliases: Aliases = Field(default_factory=Aliases)
    causes: list[Text] = Field(min_length=1)
    checks: list[Text] = Field(min_length=1)
    actions: list[Text] = Field(min_length=1)
    config_keys: list[str] = Field(default_factory=list)
    signals: list[str] = Field(default_factory=list)
    detectors: list[dict] = Field(default_factory=list)  # {kind: ..., thresholds...}: see detectors.py

    def phrases(self) -> list[str]:
        return [self.symptom.en, self.symptom.zh, *self.aliases.en, *self.aliases.zh, self.id.replace("-", " ")]


class KnowledgeBase(BaseModel):
    model_config = ConfigDict(extra="forbid")
    schema_version: int
    entries: list[Entry]

    def get(self, entry_id: str) -> Entry | None:
        return next((e for e in self.entries if e.id == entry_id), None)


@lru_cache(maxsize=1)
def load_knowledge_base() -> KnowledgeBase:
    text = resources.files("agentrl_cli.acceptance.troubleshoot").joinpath("knowledge_base.yaml").read_text(encoding="utf-8")
    return KnowledgeBase.model_validate(yaml.safe_load(text))


_INDEXES: dict[int, tuple[KnowledgeBase, Index]] = {}


def _index(kb: KnowledgeBase) -> Index:
    if id(kb) not in _INDEXES:
        _INDEXES[id(kb)] = (kb, Index(kb.entries))  # the kb is kept so its id is not reused
    return _INDEXES[id(kb)][1]


def score_entries(query: str, kb: KnowledgeBase) -> list[float]:
    """0..100 per entry: the better of the fuzzy match of its phrases and its BM25 coverage."""
    cover = _index(kb).coverage(query)
    out = []
    for e, c in zip(kb.entries, cover):
        near = max(fuzzy(query, p) for p in e.phrases())
        out.append(max(COVERAGE_SCALE * c, near if near >= FUZZY_MIN else 0.0))
    return out


def search(query: str, limit: int = 5, kb: KnowledgeBase | None = None) -> list[tuple[Entry, float]]:
    """Entries ranked by score, best first."""
    kb = kb or load_knowledge_base()
    exact = kb.get(query.strip())
    scores = score_entries(query, kb)
    ranked = sorted(zip(kb.entries, scores), key=lambda pair: (pair[0] is not exact, -pair[1]))
    return [(e, 100.0 if e is exact else min(100.0, s)) for e, s in ranked[:limit]]


def lookup(query: str, kb: KnowledgeBase | None = None) -> tuple[list[tuple[Entry, float]], list[tuple[Entry, float]]]:
    """(matches above the cutoff, closest entries); matches are within 5 points of the best."""
    ranked = search(query, limit=8, kb=kb)
    if not ranked or ranked[0][1] < MATCH_CUTOFF:
        return [], ranked[:5]
    best = ranked[0][1]
    return [(e, s) for e, s in ranked if s >= max(MATCH_CUTOFF, best - 5)][:3], ranked[:5]
