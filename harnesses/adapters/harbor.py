"""harbor: Harbor task directories (the format of harbor-framework/harbor, formerly
laude-institute/harbor: instruction.md, task.toml, environment/, tests/test.sh, solution/solve.sh)
as a harness, graded by their own tests. agentrl does not depend on the `harbor` package.

    harnesses:
      - name: harbor
        options: {tasks_dir: path/to/tasks}   # default: the shipped harnesses/adapters/harbor_tasks

An episode: `reset` takes a sandbox from the pool, writes the task's environment/ files (all but
the Docker files) into its working directory and shows instruction.md. The agent acts with
`run_shell` (terminal_like's persistent shell: the same tool spec and Hermes `<tool_call>`
convention) and ends with a final line `ANSWER: <a short final message>`. `compute_reward` grades
the episode as Harbor's verifier does, in a fresh sandbox (`harbor_verify`: the path mapping, the
tamper rule and when a verifier failure is masked rather than a zero), so `reward_source` is
`harness`. Task sets, splits and versions: `harbor_format`.

What differs from Harbor, which runs each task in its Docker container: the Dockerfile is never
built (its RUN steps, base image, `docker_image`, `network_mode`, cpus and memory do not apply: the
sandbox has the host's /usr, with python3, bash and coreutils, no network, and the `sandbox.*`
limits); environment/'s files land in the working directory, as `COPY . <WORKDIR>` would put them;
the container's WORKDIR (e.g. /app) is the sandbox's working directory (/work), in the instruction
shown and in solve.sh as well as in the tests; `[agent] timeout_sec` is recorded, not enforced
(`rollout.step_timeout_seconds` and `rollout.max_steps_per_trajectory` bound an episode);
`[verifier] timeout_sec` bounds test.sh, capped at `rollout.step_timeout_seconds`. Multi-step
tasks, `[environment] env` and Windows tasks are refused when the task set loads.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from agentrl_cli.core.errors import ConfigError
from agentrl_cli.envs.sandbox.bwrap import WORK
from harnesses.adapters import harbor_format
from harnesses.adapters.harbor_format import environment_files, map_paths, resolve_env
from harnesses.adapters.harbor_verify import HARBOR_DIR, collect, grade, root_of
from harnesses.base import Evidence, HarnessReward, Observation, TaskSet, TaskSpec, Trajectory
from harnesses.parsing import parse_answer, tool_call
from harnesses.sandboxed import SandboxHarness
from harnesses.terminal_like import TerminalLike

SYSTEM_PROMPT = """You solve a task in a Linux shell, in your working directory. Run a command with
<tool_call>
{"name": "run_shell", "arguments": {"command": "ls -l"}}
</tool_call>
When the task is done, reply with one short final line: ANSWER: <your final message>"""
_TOOL_CALLS = re.compile(r"<tool_call>.*?(?:</tool_call>|$)", re.S)


class HarborHarness(SandboxHarness):
    name = "harbor"
    version = "1.0"
    reward_source = "harness"  # graded by the task's own tests/test.sh
    reward_sources = ("harness",)  # no agentrl verifier can run its tests

    def __init__(self, tasks_dir: str | None = None, sandboxes=None, settings=None, step_timeout_s: float = 30.0,
                 **unknown) -> None:
        if unknown:
            raise ConfigError(f"harnesses[harbor].options: unknown key(s) {', '.join(sorted(unknown))}",
                              f"the harbor adapter takes: {', '.join(harbor_format.OPTIONS)}")
        super().__init__(sandboxes, settings, step_timeout_s)
        self.tasks_dir = tasks_dir  # each task carries its own directory (meta.task_dir); kept for the record

    # -- optional hooks (harnesses.base) ------------------------------------------------------------
    @classmethod
    def task_set(cls, options: dict | None = None) -> TaskSet:
        return harbor_format.task_set(dict(options or {}))

    @classmethod
    def scripted_action(cls, task: TaskSpec, turn: int) -> str | None:
        """solution/solve.sh as one run_shell call, then the final line."""
        if turn == 0:
            return tool_call("run_shell", command=solution_command(task))
        return "ANSWER: done" if turn == 1 else None

    @classmethod
    def wrong_action(cls, task: TaskSpec) -> str:
        return (tool_call("run_shell", command="echo 'not the answer' > answer.txt")
                + "\nANSWER: I could not finish this task, so I am stopping here without a solution.")

    # -- contract -----------------------------------------------------------------------------------
    def system_prompt(self) -> str:
        return SYSTEM_PROMPT

    tools = TerminalLike.tools  # the same run_shell, parsed and run the same way
    parse = TerminalLike.parse
    no_action_hint = TerminalLike.no_action_hint
    tool_run_shell = TerminalLike.tool_run_shell

    def reset(self, task_spec: TaskSpec) -> Observation:
        self._release()  # never clean in place: the old sandbox is destroyed
        self.sandbox = self._provider.acquire()
        self.task = task_spec
        files = environment_files(Path(task_spec.meta["task_dir"]))
        for path, (data, mode) in sorted(files.items()):
            self.sandbox.write_file(path, data, mode=mode)
        root = root_of(self.sandbox)
        workdir = task_spec.meta["harbor"].get("workdir")
        text = (map_paths(task_spec.prompt, {workdir: root}) if workdir else task_spec.prompt).rstrip()
        text += f"\n\nYour working directory is {root}." + (f" Files in it: {', '.join(sorted(files))}" if files else "")
        return Observation(text=text, data={"files": sorted(files)}, status="ok")

    def evidence(self, trajectory: Trajectory) -> Evidence:
        """The final answer; the files are graded by the task's own tests (`compute_reward`)."""
        answers = [a for a in (parse_answer(x.text) for x in trajectory.actions) if a is not None]
        return Evidence(final_answer=answers[-1] if answers else None)

    def compute_reward(self, trajectory: Trajectory) -> float | HarnessReward:
        """Harbor's verdict on the episode (`harbor_verify`): the reward as a float, or a HarnessReward
        where there is a flag or a detail to add. The agent's sandbox is released once its files are
        read, before the verifier's is taken, so an episode never holds two."""
        if self.sandbox is None:
            raise RuntimeError("no episode sandbox to grade: compute_reward runs once per episode, after it and before end_episode")
        task = trajectory.task
        name = task.meta["harbor"]["name"]
        try:
            final = collect(self.sandbox, self.step_timeout_s)
        finally:
            self._release()
        if final.tampered:
            return HarnessReward(0.0, ["tamper"], f"{name}: the agent wrote the verifier's reward file itself "
                                 f"({', '.join(final.tampered)}; Harbor's /logs is {HARBOR_DIR}/logs here)")
        if final.too_large:
            return HarnessReward(0.0, detail=f"{name}: the final working directory is too large to grade: {final.too_large}")
        timeout = min(float(task.meta["harbor"]["verifier_timeout_s"]), self.step_timeout_s)
        verdict = grade(self._provider, task, final, final_message(trajectory), timeout)
        return verdict if verdict.flags or verdict.detail else verdict.score


def final_message(trajectory: Trajectory) -> str | None:
    """The agent's final message: its last `ANSWER:` value, else its last reply without tool calls;
    None when it sent nothing."""
    if not trajectory.actions:
        return None
    answers = [a for a in (parse_answer(x.text) for x in trajectory.actions) if a is not None]
    return answers[-1] if answers else _TOOL_CALLS.sub("", trajectory.actions[-1].text).strip()


def solution_command(task: TaskSpec) -> str:
    """solution/solve.sh as a shell command run from the working directory: `[solution] env`
    exported first, the container's WORKDIR mapped to the sandbox's (/work)."""
    d = Path(task.meta["task_dir"])
    try:
        script = (d / "solution" / "solve.sh").read_text(encoding="utf-8")
    except OSError:
        raise ConfigError(f"Harbor task {d} has no readable solution/solve.sh", "add the oracle solution/solve.sh") from None
    workdir = task.meta["harbor"].get("workdir")
    env = resolve_env(task.meta["harbor"].get("solution_env") or {}, f"{d / 'task.toml'} [solution].env")
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())
    return exports + (map_paths(script, {workdir: WORK}) if workdir else script)
