"""How the `agent` harness runs the user's agent for one episode, given its gateway session (an
OpenAI base URL and key):

- `EntryRunner` (`options.entry: "module:function"`): `async def run(task, client_base_url, api_key)`
  called in the calling thread (the rollout's harness thread) on a private event loop of its own,
  cancelled at the deadline. A plain (non-async) function is called as is and cannot be cancelled.
  With `options.sandbox: true` it is called with a fourth argument, `sandbox`: the episode's sandbox
  from the harness's pool (`sandbox.exec(command)`), which the harness takes and gives back.
- `CommandRunner` (`options.command: "python3 my_agent.py"`): the command run by bash in a
  sandbox from the harness's provider (bubblewrap: nothing reachable but the allow-listed gateway),
  with `OPENAI_BASE_URL` and `OPENAI_API_KEY` set to the session (and `ANTHROPIC_BASE_URL`, the
  session's root without `/v1` as the anthropic SDK and Claude-Code-style agents take it, and
  `ANTHROPIC_API_KEY`), `AGENT_TASK` the task as JSON,
  and the task's prompt on stdin. `options.files` (host files or directories) are copied into the
  sandbox's work directory first, by their base names; the final answer is the last non-empty line
  the command writes to stdout; `options.collect` names work-directory files read back as evidence.
  The sandbox has the host's /usr (its `python3`, not the run's virtualenv): an agent needing
  packages brings them in `files` (e.g. a `pip install --target` directory on PYTHONPATH).

What an agent returns: its final answer as a string, or {"answer": str | None, "files": {path: text}}.
An exception it raises (an entry) or a non-zero exit (a command) is `AgentFailed`; running past the
deadline is `AgentTimeout`.

Belongs here: calling the agent. Not here: sessions and the trajectory (`agentrl_cli.runtime.rollout.agent_episode`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
from dataclasses import dataclass, field
from pathlib import Path

from agentrl_cli.core.errors import ConfigError
from agentrl_cli.core.plugins import PLUGIN_PATH, import_target
from agentrl_cli.envs.sandbox.files import UnsafePath
from harnesses.parsing import parse_answer

MAX_UPLOAD_BYTES = 16 << 20  # options.files in all: the sandbox's work directory is small (sandbox.workdir_size_mb)


class AgentTimeout(TimeoutError):
    """The agent ran past its deadline (`options.timeout_s`); what the episode path takes as a timeout."""


class AgentFailed(Exception):
    """The agent raised, exited non-zero, or returned something that is not an answer."""


@dataclass
class AgentOutcome:
    answer: str | None
    files: dict[str, bytes | None] = field(default_factory=dict)


def task_dict(task) -> dict:
    """What the agent is told of a task: never its answer."""
    return {"task_id": task.task_id, "prompt": task.prompt, "split": task.split, "difficulty": task.difficulty,
            "meta": dict(task.meta)}


def final_answer(text: str | None) -> str | None:
    """The answer in an agent's final text: its `ANSWER: X` line or `<answer>` tag when it has one,
    else the text itself, stripped (None or blank: no answer)."""
    if text is None or not str(text).strip():
        return None
    return parse_answer(str(text)) or str(text).strip()


def outcome_of(value) -> AgentOutcome:
    """What an agent returned as an AgentOutcome; AgentFailed naming what it was otherwise."""
    if value is None or isinstance(value, str):
        return AgentOutcome(final_answer(value))
    if isinstance(value, dict) and set(value) <= {"answer", "files"}:
        files = value.get("files") or {}
        if not isinstance(files, dict) or not all(isinstance(v, (str, bytes, type(None))) for v in files.values()):
            raise AgentFailed('the agent returned "files" that are not {path: text}')
        answer = value.get("answer")
        if answer is not None and not isinstance(answer, str):
            answer = str(answer)
        return AgentOutcome(final_answer(answer), {str(p): v.encode() if isinstance(v, str) else v for p, v in files.items()})
    raise AgentFailed(f"the agent returned {type(value).__name__} {value!r:.80}; return the final answer as a string, "
                      'or {"answer": ..., "files": {path: text}}')


class EntryRunner:
    """`entry`: "module:function", imported when the runner is made (ConfigError when it cannot be)."""

    def __init__(self, entry: str, sandbox: bool = False) -> None:
        if not isinstance(entry, str) or not PLUGIN_PATH.match(entry):
            raise ConfigError(f"agent harness: options.entry {entry!r} is not a `module:function` path",
                              'set harnesses[].options.entry to e.g. "my_agent:run" (an async def run(task, base_url, api_key))')
        try:
            self.fn = import_target("agent harness: options.entry", entry)
        except Exception as exc:  # noqa: BLE001 - an import error of the user's module is a config problem here
            raise ConfigError(str(getattr(exc, "message", exc)), getattr(exc, "hint", "check the module path")) from None
        if not callable(self.fn):
            raise ConfigError(f"agent harness: options.entry {entry!r} is not a function",
                              "point it at `async def run(task, client_base_url, api_key) -> str | dict`")
        self.entry, self.sandbox = entry, sandbox
        if sandbox and "sandbox" not in _parameters(self.fn):
            raise ConfigError(f"agent harness: options.sandbox is set but {entry} takes no `sandbox` argument",
                              "define it as run(task, client_base_url, api_key, sandbox), or remove options.sandbox")

    def __call__(self, task: dict, base_url: str, api_key: str, timeout_s: float, sandbox=None) -> AgentOutcome:
        """`sandbox`: the episode's, handed to an entry that takes one (the harness acquires and releases it)."""
        args = (task, base_url, api_key) + ((sandbox,) if self.sandbox else ())
        try:
            if inspect.iscoroutinefunction(self.fn):
                value = asyncio.run(self._bounded(args, timeout_s))
            else:
                value = self.fn(*args)
        except AgentTimeout:
            raise
        except Exception as exc:  # noqa: BLE001 - the agent's own failure, reported with its exception
            raise AgentFailed(f"{self.entry} raised {type(exc).__name__}: {exc}") from exc
        return outcome_of(value)

    async def _bounded(self, args: tuple, timeout_s: float):
        job = asyncio.ensure_future(self.fn(*args))
        done, _ = await asyncio.wait({job}, timeout=timeout_s)
        if not done:
            job.cancel()
            with contextlib.suppress(BaseException):
                await job
            raise AgentTimeout(f"{self.entry} ran past {timeout_s:g} s (options.timeout_s)")
        return job.result()


def _parameters(fn) -> set[str]:
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # a builtin without a signature: nothing to check
        return {"sandbox"}


def _uploads(paths) -> dict[str, bytes]:
    """options.files as {path in the work directory: bytes}: a file by its base name, a directory's
    files under its base name (ConfigError when missing or too large)."""
    out: dict[str, bytes] = {}
    for entry in paths or ():
        src = Path(str(entry)).expanduser()
        if src.is_file():
            out[src.name] = src.read_bytes()
        elif src.is_dir():
            for f in sorted(p for p in src.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
                out[str(Path(src.name) / f.relative_to(src))] = f.read_bytes()
        else:
            raise ConfigError(f"agent harness: options.files entry {str(entry)!r} is not a file or directory here",
                              "list paths (relative to the directory agentrl runs in) to copy into the sandbox")
    if sum(map(len, out.values())) > MAX_UPLOAD_BYTES:
        raise ConfigError(f"agent harness: options.files hold more than {MAX_UPLOAD_BYTES >> 20} MiB",
                          "copy less into the sandbox (its work directory is sandbox.workdir_size_mb)")
    return out


class CommandRunner:
    """`command` run by bash in a sandbox (see the module docstring)."""

    def __init__(self, command: str, files=(), collect=()) -> None:
        if not isinstance(command, str) or not command.strip():
            raise ConfigError(f"agent harness: options.command {command!r} is not a command line",
                              'set harnesses[].options.command to e.g. "python3 my_agent.py"')
        self.command, self.uploads, self.collect = command, _uploads(files), [str(p) for p in collect or ()]

    def __call__(self, task: dict, base_url: str, api_key: str, timeout_s: float, sandbox, env: dict | None = None) -> AgentOutcome:
        """Run the command in `sandbox` (the episode's: the harness acquires it, and gives it back)."""
        for path, data in self.uploads.items():
            sandbox.write_file(path, data)
        r = sandbox.exec(self.command, timeout=timeout_s, stdin=task["prompt"],
                         env={"OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": api_key, "AGENT_TASK": json.dumps(task),
                              "ANTHROPIC_BASE_URL": base_url.rstrip("/").removesuffix("/v1"),
                              "ANTHROPIC_API_KEY": api_key, **(env or {})})
        if r.killed_reason == "wall_timeout":
            raise AgentTimeout(f"`{self.command}` ran past {timeout_s:g} s (options.timeout_s)")
        if r.exit_code != 0 or r.error:
            why = r.error or (f"stopped: {r.killed_reason}" if r.killed_reason else f"exit code {r.exit_code}")
            raise AgentFailed(f"`{self.command}` failed ({why}): {r.stderr.strip()[-400:] or r.stdout.strip()[-400:]}")
        lines = [line for line in r.stdout.splitlines() if line.strip()]
        files = {}
        for path in self.collect:
            try:
                files[path] = sandbox.read_file(path, max_bytes=256 * 1024)
            except (OSError, UnsafePath):  # missing, or linked out: absent evidence, never the host's file
                files[path] = None
        return AgentOutcome(final_answer(lines[-1] if lines else None), files)
