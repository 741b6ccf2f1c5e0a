"""terminal_like: a persistent shell in a sandbox.

Convention: Hermes-style `<tool_call>` blocks calling `run_shell`; the episode ends with a line
`ANSWER: <value>`. The shell's working directory and exported variables persist between calls.
Tasks are about files and text (count, find, transform) and are verified against the answer or
against the sandbox's final state.

This folder is the whole plug-in: the class and its hooks here, its task families (`tasks.py`) and
its scripted solutions (`solutions.py`); its committed task set is `harnesses/tasksets/terminal_like.jsonl`.
"""

from __future__ import annotations

import shlex

from agentrl_cli.envs.sandbox.files import UnsafePath
from harnesses.base import Action, Evidence, Observation, TaskSpec, ToolCall, Trajectory
from harnesses.builtin import CommittedTasks
from harnesses.parsing import action_calls, answers_match, parse_answer
from harnesses.sandboxed import SandboxHarness, exec_observation, function_tool
from harnesses.terminal_like import solutions
from harnesses.terminal_like.tasks import FAMILIES

SYSTEM_PROMPT = """You operate a Linux shell in /work. Run a command with
<tool_call>
{"name": "run_shell", "arguments": {"command": "ls -l"}}
</tool_call>
When you know the result, reply with a final line: ANSWER: <value>"""


class TerminalLike(CommittedTasks, SandboxHarness):
    name = "terminal_like"
    version = "1.0"
    FAMILIES = FAMILIES
    SLIP = solutions.SLIP

    # -- optional hooks (harnesses.base) ------------------------------------------------------------
    @classmethod
    def scripted_action(cls, task: TaskSpec, turn: int) -> str | None:
        return solutions.scripted_action(task, turn)

    @classmethod
    def slip_action(cls, task: TaskSpec, turn: int, echo: bool = True) -> str | None:
        return solutions.slip_action(task, turn)

    @classmethod
    def wrong_action(cls, task: TaskSpec) -> str:
        return "ANSWER: -1"

    # -- contract -----------------------------------------------------------------------------------

    def system_prompt(self) -> str:
        return SYSTEM_PROMPT

    def tools(self) -> list[dict]:
        return [function_tool("run_shell", "Run a bash command in the working directory; cwd and exported variables persist.",
                              {"command": {"type": "string", "description": "the bash command"}}, ["command"])]

    def parse(self, action: Action) -> tuple[list[ToolCall], list[str], bool]:
        calls, errors = action_calls(action)
        return calls, errors, parse_answer(action.text) is not None

    def no_action_hint(self) -> str:
        return "no tool call found; call run_shell or reply with a final line ANSWER: <value>"

    def tool_run_shell(self, arguments: dict) -> Observation:
        command = arguments["command"]
        if not isinstance(command, str) or not command.strip():
            raise ValueError("command must be a non-empty string")
        state = "/tmp/.agentrl-shell" if self.sandbox.isolated else f"{self.sandbox.workdir}/.agentrl-shell"
        home = "/work" if self.sandbox.isolated else str(self.sandbox.workdir)
        cwd, env = shlex.quote(f"{state}-cwd"), shlex.quote(f"{state}-env")
        # bash builtins only (read, cd, ., trap, pwd, export): one process per command, the command's own
        wrapped = (f"{{ read -r d < {cwd} && cd \"$d\"; }} 2>/dev/null || cd {shlex.quote(home)}; unset d; "
                   f"[ -f {env} ] && . {env}; "
                   f"trap 'pwd > {cwd}; export -p > {env}' EXIT\n{command}")
        result = self.sandbox.exec(wrapped, timeout=self.step_timeout_s)
        return exec_observation(f"$ {command}", result)

    def evidence(self, trajectory: Trajectory) -> Evidence:
        answers = [a for a in (parse_answer(x.text) for x in trajectory.actions) if a is not None]
        state = trajectory.task.meta.get("state", {}) if trajectory.task.meta.get("verify") == "state" else {}
        return Evidence(final_answer=answers[-1] if answers else None, files=self.collect_files(sorted(state)))

    def compute_reward(self, trajectory: Trajectory) -> float:
        task = trajectory.task
        if task.meta.get("verify") == "state":
            if self.sandbox is None:
                return 0.0
            for path, expected in task.meta.get("state", {}).items():
                try:
                    if self.sandbox.read_file(path).decode("utf-8", "replace") != expected:
                        return 0.0
                except UnsafePath:
                    return 0.0
            return 1.0
        answers = [a for a in (parse_answer(x.text) for x in trajectory.actions) if a is not None]
        return 1.0 if answers and answers_match(answers[-1], task.answer) else 0.0
