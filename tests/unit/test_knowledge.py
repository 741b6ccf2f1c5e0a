"""Troubleshooting knowledge base: every seed symptom is in it, in both languages, and fuzzy
queries in English or Chinese reach the same entries."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl_cli.acceptance.troubleshoot.knowledge import MATCH_CUTOFF, load_knowledge_base, lookup, search

SEEDS = Path(__file__).resolve().parents[2].parent / "shared" / "seeds"

# Symptom cells of the troubleshooting tables, copied from the seed documents.
SEED_000_TABLE = ["训练奖励震荡大", "GPU 利用率低", "工具调用失败率高", "评测指标与训练指标差距大", "轨迹存储增长过快"]  # §4.4
SEED_003_TABLE = ["训练卡长时间空转", "集合通信卡住无报错", "显存溢出", "权重同步后效果异常", "奖励长期贴顶",
                  "环境创建失败率上升", "任务被抢占后无法续跑", "磁盘或日志打满"]  # §9
# Symptoms of seed 000 §4.1-4.3 (narrative sections).
SEED_000_NARRATIVE = {"training-not-converging": "训练不收敛", "tool-call-timeouts": "工具调用超时",
                      "concurrent-resource-contention": "并发环境下的资源竞争", "results-not-reproducible": "训练结果不可复现"}
# Verification failures implied by seed 003 §6 (stage verification points) and §8 (four layers).
VERIFICATION_FAILURES = {
    "seed003 §6": ["no-baseline", "allreduce-bandwidth-low", "storage-write-slow", "sandbox-egress-not-blocked",
                   "image-fails-to-start", "job-not-scheduled-to-pool", "inference-throughput-low", "inference-p99-high",
                   "sandbox-leaks", "timeout-not-enforced", "reward-nondeterministic", "bad-input-high-score",
                   "partitions-missing", "schema-validation-failures", "loss-nan", "reward-distribution-abnormal",
                   "checkpoint-unreadable"],
    "seed003 §8": ["control-plane-unreachable", "inference-health-failing", "sandbox-lifecycle-broken", "storage-rw-errors",
                   "reward-variance-high", "step-time-share-drift", "env-failure-rate-high", "reward-curve-wrong-direction",
                   "entropy-collapse-or-explosion", "grad-norm-unstable", "held-out-harness-drop"],
}


@pytest.fixture(scope="module")
def kb():
    return load_knowledge_base()


@pytest.mark.skipif(not SEEDS.is_dir(), reason="seed documents not beside this checkout")
def test_the_listed_rows_are_really_in_the_seeds():
    seed000 = (SEEDS / "000_79f198ff7b961060.txt").read_text(encoding="utf-8")
    seed003 = (SEEDS / "003_60325630df511fd8.txt").read_text(encoding="utf-8")
    for row in SEED_000_TABLE + list(SEED_000_NARRATIVE.values()):
        assert row in seed000, row
    for row in SEED_003_TABLE:
        assert row in seed003, row


def test_every_seed_table_row_is_an_entry(kb):
    symptoms = {e.symptom.zh: e for e in kb.entries}
    rows = SEED_000_TABLE + SEED_003_TABLE
    missing = [row for row in rows if row not in symptoms]
    assert not missing, f"seed rows missing from the knowledge base: {missing}"
    assert len(rows) == 13


def test_every_narrative_and_verification_symptom_is_an_entry(kb):
    for entry_id, zh in SEED_000_NARRATIVE.items():
        entry = kb.get(entry_id)
        assert entry is not None and entry.symptom.zh == zh
    for source, ids in VERIFICATION_FAILURES.items():
        for entry_id in ids:
            entry = kb.get(entry_id)
            assert entry is not None, entry_id
            assert any(s.startswith(source) for s in entry.source), (entry_id, entry.source)


def test_entries_are_complete_in_both_languages(kb):
    ids = [e.id for e in kb.entries]
    assert len(ids) == len(set(ids))
    for e in kb.entries:
        for item in [e.symptom, *e.causes, *e.checks, *e.actions]:
            assert item.en.strip() and item.zh.strip(), e.id
        assert all(0 <= s <= 8 for s in e.stages), e.id


def test_each_entry_is_found_by_its_own_symptom_in_either_language(kb):
    for e in kb.entries:
        for query in (e.symptom.en, e.symptom.zh):
            best, score = search(query, limit=1)[0]
            assert best.id == e.id and score >= MATCH_CUTOFF, (query, best.id)


@pytest.mark.parametrize("en,zh,entry_id", [
    ("GPU utilization low", "GPU 利用率低", "gpu-utilization-low"),
    ("gpu utilisation is low", "GPU利用率很低", "gpu-utilization-low"),
    ("training reward oscillates a lot", "训练奖励震荡", "reward-oscillation"),
    ("collective communication hangs", "集合通信卡住", "collective-hang"),
    ("out of memory", "显存溢出", "out-of-memory"),
    ("disk full", "磁盘打满", "disk-or-logs-full"),
    ("can't resume after preemption", "任务被抢占后无法续跑", "cannot-resume-after-preemption"),
])
def test_english_and_chinese_queries_reach_the_same_entry(en, zh, entry_id):
    matches_en, _ = lookup(en)
    matches_zh, _ = lookup(zh)
    assert matches_en and matches_en[0][0].id == entry_id, [(e.id, s) for e, s in matches_en]
    assert matches_zh and matches_zh[0][0].id == entry_id, [(e.id, s) for e, s in matches_zh]


def test_unknown_symptom_matches_nothing_but_lists_the_closest():
    matches, closest = lookup("the espresso machine whistles")
    assert matches == []
    assert len(closest) == 5 and closest[0][1] < MATCH_CUTOFF


def test_exact_id_is_a_match(kb):
    matches, _ = lookup("trainer-idle")
    assert matches[0][0].id == "trainer-idle"


def test_config_keys_named_by_entries_exist(kb):
    from agentrl_cli.config.explain import describe_keys

    known = {row[0] for row in describe_keys()}
    sections = {k.split(".")[0] for k in known} | {k.rsplit(".", 1)[0].removesuffix("[]") for k in known}
    for e in kb.entries:
        for key in e.config_keys:
            assert key in known or key in sections, (e.id, key)
