"""The curriculum draws (family, difficulty) buckets by learnability p(1-p): a bucket the policy solves
sometimes comes up most, buckets it always or never solves fade but are still tried, and the harness
mix is kept."""

from __future__ import annotations

from collections import Counter

from agentrl_cli.runtime.rollout.sampler import CURRICULUM_FLOOR, TaskSampler
from harnesses.tasks import load_tasks


def _sampler(**kw) -> TaskSampler:
    tasks = {"terminal_like": load_tasks("terminal_like", "train"), "code_sandbox_like": load_tasks("code_sandbox_like", "train")}
    return TaskSampler(tasks, {"terminal_like": 1, "code_sandbox_like": 1}, group_size=2, seed=3, curriculum=True, **kw)


def _feed(sampler: TaskSampler, harness: str, family: str, difficulty: int, rate: float, n: int = 40) -> None:
    task = next(t for t in sampler.tasks[harness] if t.meta["family"] == family and t.difficulty == difficulty)
    for i in range(n):
        sampler.record(task, i < rate * n)


def test_unseen_buckets_are_drawn_evenly_at_first():
    s = _sampler()
    drawn = Counter((g[0].task.meta["family"], g[0].task.difficulty) for g in (s.next_group() for _ in range(1200))
                    if g[0].task.harness == "terminal_like")
    assert len(drawn) == 12  # 4 families x 3 difficulties
    assert max(drawn.values()) < 2 * min(drawn.values())


def test_a_bucket_solved_half_the_time_dominates_and_solved_or_hopeless_ones_fade():
    s = _sampler()
    for family in ("arith", "count_matches", "sum_column", "uppercase_file"):
        for d in (1, 2, 3):
            _feed(s, "terminal_like", family, d, 1.0 if family == "uppercase_file" else 0.0)
    _feed(s, "terminal_like", "count_matches", 2, 0.5, n=64)  # the whole window
    assert s.learnability("terminal_like", "count_matches", 2) == 0.25 + CURRICULUM_FLOOR
    assert s.learnability("terminal_like", "uppercase_file", 1) == CURRICULUM_FLOOR
    groups = [s.next_group() for _ in range(2000)]
    terminal = [g[0].task for g in groups if g[0].task.harness == "terminal_like"]
    share = sum(t.meta["family"] == "count_matches" and t.difficulty == 2 for t in terminal) / len(terminal)
    expected = (0.25 + CURRICULUM_FLOOR) / (0.25 + 12 * CURRICULUM_FLOOR)
    assert abs(share - expected) < 0.05
    assert len({(t.meta["family"], t.difficulty) for t in terminal}) == 12  # the others are still tried
    assert 0.45 < len(terminal) / len(groups) < 0.55  # the harness mix is the configured one


def test_the_curriculum_history_survives_a_checkpoint():
    s = _sampler()
    _feed(s, "code_sandbox_like", "list_function", 1, 0.25)
    restored = _sampler()
    restored.load_state_dict(s.state_dict())
    assert restored.learnability("code_sandbox_like", "list_function", 1) == s.learnability("code_sandbox_like", "list_function", 1)
    assert [(d.task.task_id, d.seed) for d in restored.next_group()] == [(d.task.task_id, d.seed) for d in s.next_group()]
