"""Look symptoms up in the knowledge base, in English or Chinese, by fuzzy match.

The knowledge base is data (`knowledge_base.yaml`): every symptom from the seed documents'
troubleshooting tables and the verification failures of the runbook, each with causes, how to
check and what to do, in both languages. Matching scores a query against every entry's symptom,
aliases and id with rapidfuzz and keeps the best string per entry.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

import yaml
from pydantic import BaseModel, ConfigDict, Field
from rapidfuzz import fuzz
from rapidfuzz.utils import default_process

MATCH_CUTOFF = 72.0  # below this a query "does not match" and the closest entries are listed


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
    text = resources.files("agentrl_cli.troubleshoot").joinpath("knowledge_base.yaml").read_text(encoding="utf-8")
    return KnowledgeBase.model_validate(yaml.safe_load(text))


def _score(query: str, phrase: str) -> float:
    """0..100. Word order is ignored; spaces are ignored for CJK-style comparison; a partial match
    counts only when the shorter string is at least half the longer, so short phrases inside long
    unrelated queries do not score high."""
    q, p = default_process(query), default_process(phrase)
    if not q or not p:
        return 0.0
    cq, cp = q.replace(" ", ""), p.replace(" ", "")
    score = max(fuzz.token_sort_ratio(q, p), fuzz.ratio(cq, cp))
    short, long_ = sorted((cq, cp), key=len)
    if len(short) >= 3 and len(short) >= 0.5 * len(long_):
        score = max(score, 0.95 * fuzz.partial_ratio(cq, cp))
    return float(score)


def search(query: str, limit: int = 5, kb: KnowledgeBase | None = None) -> list[tuple[Entry, float]]:
    """Entries ranked by their best-matching phrase, best first."""
    kb = kb or load_knowledge_base()
    exact = kb.get(query.strip())
    scored = [(e, 100.0 if e is exact else max(_score(query, p) for p in e.phrases())) for e in kb.entries]
    scored.sort(key=lambda pair: -pair[1])
    return scored[:limit]


def lookup(query: str, kb: KnowledgeBase | None = None) -> tuple[list[tuple[Entry, float]], list[tuple[Entry, float]]]:
    """(matches above the cutoff, closest entries); matches are within 5 points of the best."""
    ranked = search(query, limit=8, kb=kb)
    if not ranked or ranked[0][1] < MATCH_CUTOFF:
        return [], ranked[:5]
    best = ranked[0][1]
    return [(e, s) for e, s in ranked if s >= max(MATCH_CUTOFF, best - 5)][:3], ranked[:5]
