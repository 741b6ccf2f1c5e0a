"""An agent's shell tool run in the episode's agentrl sandbox, not on the host: the environment an
agent framework executes its commands through, for an `entry` agent that asks for a sandbox
(`harnesses[].options.sandbox: true`; the entry then takes a `sandbox` argument).

`SandboxEnvironment` follows mini-swe-agent's `Environment` protocol (`execute(action, cwd)` ->
{"output", "returncode", "exception_info"}, `get_template_vars`, `serialize`; see
minisweagent/environments/local.py), so `DefaultAgent(model, SandboxEnvironment(sandbox), ...)`
runs mini-swe-agent unchanged with every command inside bubblewrap: the sandbox's own /work, no
network, the host's files out of reach. It imports nothing of mini-swe-agent; a command whose first
output line is `COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT` raises mini-swe-agent's `Submitted`, as its
local environment does.

Not here: running the agent (`runners.py`), the sandbox itself (`agentrl_cli.envs.sandbox`).
"""

from __future__ import annotations

import platform
from typing import Any

SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


class SandboxEnvironment:
    """mini-swe-agent's Environment over an agentrl `Sandbox` (`sandbox.exec`). `timeout`: seconds per
    command (default: the sandbox's own wall limit); `env`: variables set for every command."""

    def __init__(self, sandbox, *, timeout: float | None = None, env: dict[str, str] | None = None) -> None:
        self.sandbox, self.timeout, self.env = sandbox, timeout, dict(env or {})
        self.config = {"timeout": timeout, "env": self.env, "cwd": "/work"}

    def execute(self, action: dict, cwd: str = "", *, timeout: float | None = None) -> dict[str, Any]:
        command = action.get("command", "") if isinstance(action, dict) else str(action)
        r = self.sandbox.exec(command, timeout=timeout or self.timeout, env=self.env, cwd=cwd or None)
        output = r.stdout + r.stderr  # the local environment merges stderr into stdout
        why = r.error or (f"the sandbox stopped the command: {r.killed_reason}" if r.killed_reason else "")
        result = {"output": output, "returncode": r.exit_code if r.exit_code is not None else -1,
                  "exception_info": f"An error occurred while executing the command: {why}" if why else ""}
        lines = output.lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT and result["returncode"] == 0:
            from minisweagent.exceptions import Submitted  # only an agent of mini-swe-agent asks to submit

            submission = "".join(lines[1:])
            raise Submitted({"role": "exit", "content": submission,
                             "extra": {"exit_status": "Submitted", "submission": submission}})
        return result

    def get_template_vars(self, **kwargs) -> dict[str, Any]:
        return {**self.config, **platform.uname()._asdict(), **kwargs}

    def serialize(self) -> dict:
        return {"info": {"config": {"environment": {k: v for k, v in self.config.items()},
                                    "environment_type": f"{type(self).__module__}.{type(self).__name__}"}}}
