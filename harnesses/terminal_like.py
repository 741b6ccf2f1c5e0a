"""terminal_like: a persistent shell in a sandbox.

Convention: Hermes-style `<tool_call>` blocks calling `run_shell`; the episode ends with a line
`ANSWER: <value>`. The shell's working directory and exported variables persist between calls.
Tasks are about files and text (count, find, transform) and are verified against the answer or
against the sandbox's final state.
"""

from __future__ import annotations

import shlex

from harnesses.base import Action, Evidence, Observation, ToolCall, Trajectory
from harnesses.parsing import answers_match, parse_answer, parse_tool_calls
from harnesses.sandboxed import SandboxHarness, exec_observation, function_tool
from agentrl_cli.sandbox.files import UnsafePath

SYSTEM_PROMPT = """You operate a Linux shell in /work. Run a command with
<tool_call>
{"name": "run_shell", "arguments": {"command": "ls -l"}}
</tool_call>
When you know the result, reply with a final line: ANSWER: <value>"""


class TerminalLike(SandboxHarness):
    name = "terminal_like"
    version = "1.0"

    def system_prompt(self) -> str:
        return SYSTEM_PROMPT

    def tools(self) -> list[dict]:
        return [function_tool("run_shell", "Run a bash command in the working directory; cwd and exported variables persist.",
                              {"command": {"type": "string", "description": "the bash command"}}, ["command"])]

    def parse(self, action: Action) -> tuple[list[ToolCall], list[str], bool]:
        calls, errors = parse_tool_calls(action.text) if not action.tool_calls else (action.tool_calls, [])
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
