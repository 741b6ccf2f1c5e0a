"""The task hooks the built-in harnesses share: a harness whose task set is committed in this
repository (`harnesses/tasksets/<name>.jsonl`) lists its task families in `FAMILIES` and inherits
`task_set()`, `generate(split)`, `practice_tasks(n)` and `canary_tasks()` from `CommittedTasks`.
Its scripted solutions stay in its own folder."""

from __future__ import annotations

from agentrl_cli.core.episode import TaskSet, TaskSpec
from harnesses import taskgen
from harnesses.canaries import canaries_of


class CommittedTasks:
    """The task hooks of a harness whose task set is committed here: `FAMILIES` (family name ->
    generator) gives `task_set()`, `generate(split)`, `practice_tasks(n)` and `canary_tasks()`."""

    name: str
    FAMILIES: dict[str, taskgen.Family] = {}

    @classmethod
    def task_set(cls) -> TaskSet:
        return TaskSet(taskgen.TASK_SET_VERSION, taskgen.committed(cls.name))

    @classmethod
    def generate(cls, split: str) -> list[TaskSpec]:
        return taskgen.generate(cls.name, cls.FAMILIES, split)

    @classmethod
    def practice_tasks(cls, per_family: int, offset: int = taskgen.PRACTICE_OFFSET) -> list[TaskSpec]:
        return taskgen.practice(cls.name, cls.FAMILIES, per_family, offset)

    @classmethod
    def canary_tasks(cls) -> list[TaskSpec]:
        return canaries_of(cls.task_set().select("eval"))
