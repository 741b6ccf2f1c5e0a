"""Sandboxes for agent-written commands and code: bubblewrap with the profile of docs/security.md
(`bwrap.py`), limits from outside (`limits.py`, `cgroups.py`), a seccomp filter (`seccomp.py`), the
in-sandbox supervisor (`supervisor.py`), one sandbox (`envs/sandbox.py`), link-safe file access
(`files.py`) and the warm pool (`pool.py`)."""

from agentrl_cli.envs.sandbox.bwrap import SandboxUnavailable
from agentrl_cli.envs.sandbox.limits import Limits
from agentrl_cli.envs.sandbox.pool import PoolExhausted, SandboxPool
from agentrl_cli.envs.sandbox.result import ExecResult
from agentrl_cli.envs.sandbox.sandbox import Sandbox, SandboxSettings

__all__ = ["ExecResult", "Limits", "PoolExhausted", "Sandbox", "SandboxPool", "SandboxSettings", "SandboxUnavailable"]
