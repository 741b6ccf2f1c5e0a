"""Reward-integrity canaries: tasks no answer can pass. The real scorer gives every answer a
cheating or careless agent tries an outcome of 0; a verifier that accepts anything is caught."""

from __future__ import annotations

import shutil

import pytest

from agentrl_cli.config import load_config
from agentrl_cli.runtime.reward.models import ScoreRequest
from agentrl_cli.runtime.reward.scorer import Scorer
from agentrl_cli.runtime.reward.verifiers import Verdict, default_verifiers
from harnesses.canaries import attempts, canary_tasks, is_canary, original_of
from harnesses.tasks import HARNESS_FAMILIES, load_tasks


def requests(harnesses, kinds=("answer", "state", "tests")) -> list[ScoreRequest]:
    out = []
    for h in harnesses:
        for task in canary_tasks(h):
            if task.meta["verify"] not in kinds:
                continue
            for i, a in enumerate(attempts(task, original_of(task))):
                out.append(ScoreRequest.model_validate({
                    "task": {"task_id": task.task_id, "harness": task.harness, "prompt": task.prompt, "answer": task.answer,
                             "difficulty": task.difficulty, "split": task.split, "meta": task.meta},
                    "trajectory_id": f"c-{i}-{task.task_id.replace('/', '-')}", "steps": [{"action": "x"}], **a}))
    return out


def test_every_built_in_harness_has_canaries_that_look_like_its_tasks():
    for harness, families in HARNESS_FAMILIES.items():
        canaries = canary_tasks(harness)
        assert {c.meta["looks_like"] for c in canaries} == set(families)
        for c in canaries:
            assert is_canary(c.task_id) and c.split == "eval" and c.meta["canary"]
            original = original_of(c)
            assert c.prompt == original.prompt
            assert (c.answer, c.meta.get("state"), c.meta.get("tests")) != (original.answer, original.meta.get("state"),
                                                                            original.meta.get("tests"))
    assert not any(is_canary(t.task_id) for h in HARNESS_FAMILIES for t in load_tasks(h))
    assert canary_tasks("not_a_builtin") == []


def test_the_real_scorer_gives_no_canary_attempt_a_positive_outcome_without_sandboxes():
    scorer = Scorer(verifiers={k: v for k, v in default_verifiers(None).items() if k != "tests"})
    results = scorer.score_batch(requests(HARNESS_FAMILIES, kinds=("answer", "state")))
    assert len(results) > 30
    assert all(r.components["outcome"] == 0.0 and r.outcome not in ("success", "partial") for r in results), \
        [(r.trajectory_id, r.components) for r in results if r.components.get("outcome")]


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")
def test_contradicting_hidden_tests_fail_in_a_real_sandbox():
    from agentrl_cli.envs.sandbox.provider import provider_from_config

    cfg = load_config(None, []).config
    scorer = Scorer.from_config(cfg, provider_from_config(cfg.sandbox))
    reqs = [r for r in requests(["code_sandbox_like"], kinds=("tests",)) if r.files]
    results = scorer.score_batch(reqs)
    assert reqs and all(r.status != "infra_error" and r.components["outcome"] == 0.0 for r in results), results


class AcceptsAnything:
    name, version = "answer", "broken"

    def verify(self, req):
        return Verdict(1.0, detail="accepted")


def test_a_verifier_that_accepts_anything_is_caught_by_the_canaries():
    scorer = Scorer(verifiers={"answer": AcceptsAnything()})
    results = scorer.score_batch(requests(HARNESS_FAMILIES, kinds=("answer",)))
    assert results and all(r.components["outcome"] == 1.0 and r.outcome == "success" for r in results if r.status == "ok")


def test_a_canary_resets_like_an_ordinary_task():
    from harnesses.registry import create

    cfg = load_config(None, []).config
    harness = create("tool_api_like", cfg)
    try:
        obs = harness.reset(canary_tasks("tool_api_like")[0])
        assert obs.status == "ok" and obs.text
    finally:
        harness.close()
