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


def test_practice_tasks_are_fresh_training_tasks_that_never_show_an_eval_prompt():
    from harnesses.tasks import practice_tasks

    for harness in ("terminal_like", "code_sandbox_like"):
        tasks = practice_tasks(harness, 60)
        assert tasks == practice_tasks(harness, 60)  # deterministic
        ids = [t.task_id for t in tasks]
        assert len(ids) == len(set(ids)) and all("/practice/" in i and t.split == "train" for i, t in zip(ids, tasks))
        shown = {(t.prompt, json.dumps(t.meta.get("files"), sort_keys=True)) for t in load_tasks(harness, "eval")}
        assert not any((t.prompt, json.dumps(t.meta.get("files"), sort_keys=True)) in shown for t in tasks)
        train = {(t.prompt, json.dumps(t.meta.get("files"), sort_keys=True)) for t in load_tasks(harness, "train")}
        assert sum((t.prompt, json.dumps(t.meta.get("files"), sort_keys=True)) not in train for t in tasks) > len(tasks) // 2
    code_families = {t.meta["family"] for t in practice_tasks("code_sandbox_like", 60)}
    assert code_families == {"arith"}  # every list_function prompt is also an eval prompt, so none is practised
