"""Harbor tasks for the `agent` harness (`options.tasks: harbor`, the shipped
`harnesses/adapters/harbor_tasks`): a command agent, or an entry agent with `options.sandbox: true`,
works on the task in its episode's sandbox, graded by the task's own tests as the `harbor` harness grades it
(`harbor_verify`: the final working directory carried to a fresh sandbox with tests/, test.sh's
reward). Needs `harnesses[].reward: harness` (no agentrl verifier can run the tests).

In the sandbox, as in the `harbor` harness's fallback: environment/'s files (all but the Docker
files) in the working directory (/work), the container's WORKDIR mapped to it in the instruction;
the Dockerfile is not built here.

Belongs here: preparing a Harbor task's sandbox and grading it. Not here: the task format
(`harnesses.adapters.harbor_format`), the grading itself (`harnesses.adapters.harbor_verify`).
"""

from __future__ import annotations

from pathlib import Path

from agentrl_cli.core.episode import HarnessReward, TaskSet, TaskSpec
from agentrl_cli.envs.sandbox.bwrap import WORK
from harnesses.adapters import harbor_format
from harnesses.adapters.harbor_format import environment_files, map_paths
from harnesses.adapters.harbor_verify import FinalFiles, collect, grade

NAME = "harbor"


def task_set() -> TaskSet:
    return harbor_format.task_set({})


def is_harbor(task: TaskSpec) -> bool:
    return isinstance(task.meta.get("harbor"), dict) and "task_dir" in task.meta


def prompt(task: TaskSpec) -> str:
    """The instruction as the agent reads it: the container's WORKDIR mapped to the sandbox's, its files named."""
    workdir = task.meta["harbor"].get("workdir")
    text = (map_paths(task.prompt, {workdir: WORK}) if workdir else task.prompt).rstrip()
    files = sorted(environment_files(Path(task.meta["task_dir"])))
    return text + f"\n\nYour working directory is {WORK}." + (f" Files in it: {', '.join(files)}" if files else "")


def prepare(sandbox, task: TaskSpec) -> None:
    """environment/'s files into the sandbox's working directory."""
    for path, (data, mode) in sorted(environment_files(Path(task.meta["task_dir"])).items()):
        sandbox.write_file(path, data, mode=mode)


def final_files(sandbox, task: TaskSpec) -> FinalFiles:
    """The sandbox's final working directory, read before it is given back."""
    return collect(sandbox, verifier_timeout(task))


def verdict(provider, task: TaskSpec, final: FinalFiles, answer: str | None) -> HarnessReward:
    """Harbor's verdict: the task's tests/test.sh on the final files in a fresh sandbox of `provider`."""
    name = task.meta["harbor"]["name"]
    if final.tampered:
        return HarnessReward(0.0, ["tamper"], f"{name}: the agent wrote the verifier's reward file itself "
                             f"({', '.join(final.tampered)})")
    if final.too_large:
        return HarnessReward(0.0, detail=f"{name}: the final working directory is too large to grade: {final.too_large}")
    return grade(provider, task, final, answer, verifier_timeout(task))


def verifier_timeout(task: TaskSpec) -> float:
    return float(task.meta["harbor"].get("verifier_timeout_s") or 60.0)
