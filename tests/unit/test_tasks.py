"""Task sets: committed files match the generator; splits, difficulties, the shared family."""

from __future__ import annotations

import json
from dataclasses import asdict

from harnesses.tasks import HARNESS_FAMILIES, SPLITS, TASK_SET_VERSION, generate, load_tasks


def test_committed_task_sets_match_the_generator():
    for harness in HARNESS_FAMILIES:
        committed = [asdict(t) for t in load_tasks(harness)]
        generated = [json.loads(json.dumps(asdict(t), sort_keys=True)) for s in SPLITS for t in generate(harness, s)]
        assert committed == generated, f"regenerate: python -m harnesses.tasks ({harness})"


def test_splits_difficulties_and_unique_ids():
    ids = set()
    for harness in HARNESS_FAMILIES:
        for split in SPLITS:
            tasks = load_tasks(harness, split)
            assert tasks and all(t.split == split and t.harness == harness for t in tasks)
            assert {t.difficulty for t in tasks} == {1, 2, 3}
            ids.update(t.task_id for t in tasks)
    assert len(ids) == sum(len(load_tasks(h)) for h in HARNESS_FAMILIES)
    assert TASK_SET_VERSION


def test_one_family_is_solvable_through_every_harness():
    for harness in HARNESS_FAMILIES:
        tasks = load_tasks(harness, "eval", "arith")
        assert tasks and all("expression" in t.meta for t in tasks)


def test_hidden_tests_are_not_in_the_files_the_agent_sees():
    for t in load_tasks("code_sandbox_like"):
        assert "files" not in t.meta and t.meta["tests"]


def test_practice_tasks_are_fresh_tasks_never_equal_to_a_committed_one():
    from harnesses.tasks import practice_tasks

    key = lambda t: (t.prompt, json.dumps({k: t.meta.get(k) for k in ("files", "tests")}, sort_keys=True))  # noqa: E731
    for harness in ("terminal_like", "code_sandbox_like"):
        tasks = practice_tasks(harness, 60)
        assert tasks == practice_tasks(harness, 60)  # deterministic
        ids = [t.task_id for t in tasks]
        assert len(ids) == len(set(ids)) and all("/practice/" in i and t.split == "train" for i, t in zip(ids, tasks))
        committed = {key(t) for t in load_tasks(harness)}
        assert not any(key(t) in committed for t in tasks)
        assert {t.meta["family"] for t in tasks} == set(HARNESS_FAMILIES[harness])
        assert len(tasks) > 0.9 * 60 * len(HARNESS_FAMILIES[harness])
