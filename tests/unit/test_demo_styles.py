"""The warm start's demonstrations: one task in four (a fixed, hash-chosen set) in the terser style,
which only the code harness has; three in five (another fixed set) with the harness's one slip."""

from __future__ import annotations

from agentrl_cli.model.demos import SLIP_IN, SLIP_OF, TERSE_EVERY, demo_policy
from harnesses.oracle import oracle_action, slip_action, terse_action, terse_slip_action
from harnesses.tasks import load_tasks, practice_tasks


def test_about_one_code_task_in_four_is_demonstrated_tersely_and_always_the_same_ones():
    tasks = load_tasks("code_sandbox_like", "train")
    terse = [t.task_id for t in tasks if demo_policy(t) in (terse_action, terse_slip_action)]
    assert 0.5 / TERSE_EVERY < len(terse) / len(tasks) < 1.5 / TERSE_EVERY
    assert terse == [t.task_id for t in load_tasks("code_sandbox_like", "train") if demo_policy(t) in (terse_action, terse_slip_action)]
    for kind in ("sum_even", "count_negative", "max_minus_min"):  # every list function is shown every way
        same = [t for t in tasks if t.meta.get("kind") == kind]
        assert {demo_policy(t) for t in same} == {oracle_action, terse_action, slip_action, terse_slip_action}


def test_three_demonstrations_in_five_carry_the_slip_in_every_family_and_always_the_same_ones():
    for harness in ("terminal_like", "code_sandbox_like"):
        tasks = practice_tasks(harness, 200)
        for family in {t.meta["family"] for t in tasks}:
            same = [t for t in tasks if t.meta["family"] == family]
            slipped = [t.task_id for t in same if demo_policy(t) in (slip_action, terse_slip_action)]
            assert abs(len(slipped) / len(same) - SLIP_IN / SLIP_OF) < 0.1, (harness, family)
            assert slipped == [t.task_id for t in practice_tasks(harness, 200)
                               if t.meta["family"] == family and demo_policy(t) in (slip_action, terse_slip_action)]


def test_the_slip_changes_only_the_file_the_answer_is_written_to():
    code = load_tasks("code_sandbox_like", "train", "list_function")[0]
    assert slip_action(code, 0) == oracle_action(code, 0).replace("'solution.py'", "'solve.py'") != oracle_action(code, 0)
    assert terse_slip_action(code, 0) == terse_action(code, 0).replace("'solution.py'", "'solve.py'")
    assert slip_action(code, 1) == "SUBMIT"
    upper = load_tasks("terminal_like", "train", "uppercase_file")[0]
    assert "out.txt" in oracle_action(upper, 0) and "out.txt" not in slip_action(upper, 0)
    assert slip_action(upper, 1) == oracle_action(upper, 1) == "ANSWER: done"
    for family in ("arith", "count_matches", "sum_column"):  # the terminal's other families have no slip
        t = load_tasks("terminal_like", "train", family)[0]
        assert [slip_action(t, k) for k in range(3)] == [oracle_action(t, k) for k in range(3)]


def test_the_terse_style_drops_only_the_echo_and_other_harnesses_have_none():
    task = load_tasks("code_sandbox_like", "train", "list_function")[0]
    full, short = oracle_action(task, 0), terse_action(task, 0)
    assert full.replace("\nprint(open('solution.py').read())", "") == short
    assert terse_action(task, 1) == oracle_action(task, 1) == "SUBMIT"
    for harness in ("terminal_like", "tool_api_like"):
        t = load_tasks(harness, "train")[0]
        assert [terse_action(t, k) for k in range(3)] == [oracle_action(t, k) for k in range(3)]


class EchoHarness:
    """Stands in for a harness: answers every action with its text, the second one ends the episode."""

    def __init__(self):
        self.turn = 0

    def system_prompt(self):
        return "S"

    def tools(self):
        return []

    def reset(self, task):
        from harnesses.base import Observation
        self.turn = 0
        return Observation(text=task.prompt)

    def step(self, action):
        from harnesses.base import Observation
        self.turn += 1
        return Observation(text=action.text, done=self.turn >= 2)

    def close(self):
        pass


def test_the_built_in_warm_start_demonstrates_practice_tasks_only():
    from agentrl_cli.model.demos import collect
    from agentrl_cli.model.recipe import WARM_START_HARNESSES

    demos = collect(list(WARM_START_HARNESSES), split=None, practice_per_family=3, make=lambda name: EchoHarness(), workers=2)
    committed = {t.task_id for h in WARM_START_HARNESSES for t in load_tasks(h)}
    assert demos and all("/practice/" in d["task_id"] and d["task_id"] not in committed for d in demos)
    assert {d["harness"] for d in demos} == set(WARM_START_HARNESSES)
    with_train = collect(["terminal_like"], practice_per_family=0, make=lambda name: EchoHarness())
    assert len(with_train) == len(load_tasks("terminal_like", "train"))
