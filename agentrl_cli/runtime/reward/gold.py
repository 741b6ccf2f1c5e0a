"""The null and gold check of a task (docs/security.md row 18): scored through the task's own verifier,
unchanged work (no answer, the starting files, a do-nothing solution) must fail and the reference
solution must pass; a task that does not behave so is quarantined and never scored, because its
reward would teach the policy something false."""

from __future__ import annotations

import base64
import uuid

from agentrl_cli.core.outcomes import RewardStatus
from agentrl_cli.runtime.reward.models import FileIn, ScoreRequest, StepIn, TaskIn
from harnesses.base import TaskSpec

NULL_SOLUTION = "def solve(*args):\n    return None\n"


def _request(task: TaskSpec, *, final_answer=None, files: dict[str, str] | None = None) -> ScoreRequest:
    return ScoreRequest(
        task=TaskIn(task_id=task.task_id, harness=task.harness, prompt=task.prompt, answer=task.answer,
                    difficulty=task.difficulty, split=task.split, meta=dict(task.meta)),
        trajectory_id=f"nullgold-{uuid.uuid4().hex[:12]}", steps=[StepIn(action="(check)")],
        final_answer=final_answer,
        files=[FileIn(path=p, content_b64=base64.b64encode(c.encode()).decode()) for p, c in (files or {}).items()])


def null_and_gold(task: TaskSpec) -> tuple[ScoreRequest, ScoreRequest]:
    from harnesses.oracle import reference_solution

    verify = task.meta.get("verify", "answer")
    if verify == "tests":
        return (_request(task, files={"solution.py": NULL_SOLUTION}),
                _request(task, files={"solution.py": reference_solution(task)}))
    if verify == "state":
        start = {p: task.meta.get("files", {}).get(p, "") for p in task.meta.get("state", {})}
        return _request(task, files=start), _request(task, files=dict(task.meta["state"]))
    return _request(task, final_answer=None), _request(task, final_answer=str(task.answer))


def check_task(task: TaskSpec, scorer) -> tuple[bool, str]:
    """(ok, why): the null attempt fails and the gold one passes, both judged (not infra_error)."""
    null, gold = null_and_gold(task)
    r_null, r_gold = scorer.score(null), scorer.score(gold)
    if RewardStatus.INFRA_ERROR in (r_null.status, r_gold.status):
        return False, f"could not judge: {r_null.detail or r_gold.detail}"
    if r_null.components.get("outcome", 0.0) >= 1.0:
        return False, f"unchanged work passes ({r_null.detail})"
    if r_gold.components.get("outcome", 0.0) < 1.0:
        return False, f"the reference solution fails ({r_gold.detail})"
    return True, "null fails, gold passes"


def quarantine_failing(tasks: list[TaskSpec], scorer) -> dict[str, str]:
    """Run the check on every task; failing ones go into `scorer.quarantined`. Returns them."""
    bad = {}
    for task in tasks:
        ok, why = check_task(task, scorer)
        if not ok:
            bad[task.task_id] = why
    scorer.quarantined.update(bad)
    return bad
