"""Shared machinery of the harnesses that act through a sandbox: one sandbox per episode taken from
a provider (the warm pool, or one started directly), task files written before the first
observation, tool dispatch with explicit observation statuses, and destroy-on-reset.

A subclass sets `name`, `version`, `tools()`, `system_prompt()`, `parse(action)` (its own action
convention) and one `tool_<name>(arguments)` method per tool. Every call a step dispatches is
reported on `Observation.calls` with the tool's name, its arguments, its own status, latency and
exit code.
"""

from __future__ import annotations

from agentrl_cli.envs.sandbox import ExecResult, Sandbox, SandboxSettings
from agentrl_cli.envs.sandbox.files import UnsafePath
from agentrl_cli.envs.sandbox.provider import DirectProvider, SandboxProvider
from harnesses.base import Action, Observation, TaskSpec, ToolCall, ToolCallResult

MAX_OBSERVATION_CHARS = 2000
STATUS_ORDER = ("ok", "empty", "invalid_action", "rate_limited", "timeout", "error")  # worst last


def clip(text: str, limit: int = MAX_OBSERVATION_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 40] + f"\n... [{len(text) - limit + 40} characters cut]"


def worst(statuses: list[str]) -> str:
    return max(statuses, key=STATUS_ORDER.index) if statuses else "ok"


def exec_observation(header: str, r: ExecResult) -> Observation:
    """A command's result as an observation: output, exit code, and why it stopped if it was stopped."""
    lines = [header, clip(r.output.rstrip("\n"))] if r.output else [header]
    if r.killed_reason:
        lines.append(f"[stopped: {r.killed_reason.replace('_', ' ')}]")
    if r.truncated:
        lines.append("[output truncated]")
    lines.append(f"[exit code {r.exit_code}]")
    status = r.status
    if status == "ok" and not r.output.strip():
        status = "empty"  # success with nothing to show: never reported as a failure
    return Observation(text="\n".join(lines), status=status,
                       info={"exit_code": r.exit_code, "duration_s": r.duration_s, "killed_reason": r.killed_reason,
                             "truncated": r.truncated})


class SandboxHarness:
    name = "sandboxed"
    version = "0"

    def __init__(self, sandboxes: SandboxProvider | None = None, settings: SandboxSettings | None = None,
                 step_timeout_s: float = 30.0) -> None:
        self._provider = sandboxes or DirectProvider(settings)
        self.step_timeout_s = step_timeout_s
        self.sandbox: Sandbox | None = None
        self.task: TaskSpec | None = None
        self.episode_resources: dict | None = None  # the last released sandbox's use (Sandbox.resources)
        self.episode_image_digest = ""  # the image the episode's sandbox runs in ("" = the host root)

    # -- contract -------------------------------------------------------------------------------
    def reset(self, task_spec: TaskSpec) -> Observation:
        self._release()  # never clean in place: the old sandbox is destroyed
        self.episode_resources = None
        self.sandbox = self._provider.acquire()
        self.episode_image_digest = image_digest_of(self.sandbox)
        self.task = task_spec
        files = task_spec.meta.get("files", {})
        for path, content in sorted(files.items()):
            self.sandbox.write_file(path, content)
        text = task_spec.prompt
        if files:
            text += "\nFiles in the working directory: " + ", ".join(sorted(files))
        return Observation(text=text, data={"files": sorted(files)}, status="ok")

    def step(self, action: Action) -> Observation:
        if self.task is None or self.sandbox is None:
            return Observation(text="no episode is running: reset first", status="invalid_action", done=True)
        calls, errors, done = self.parse(action)
        if errors and not calls:
            return Observation(text="invalid action: " + "; ".join(errors), status="invalid_action")
        if done and not calls:
            return Observation(text="submitted", status="ok", done=True)
        if not calls:
            return Observation(text=self.no_action_hint(), status="invalid_action")
        observations = [self._dispatch(call) for call in calls]
        return Observation(text="\n".join(o.text for o in observations), status=worst([o.status for o in observations]),
                           done=done, info={"parse_errors": errors},
                           calls=[call_result(c, o) for c, o in zip(calls, observations)])

    def end_episode(self) -> None:
        """The episode is over and its evidence collected: give the sandbox back now (destroyed, and
        the warm pool starts a replacement), instead of holding it until the next reset."""
        self._release()

    def full_reset(self) -> None:
        """Destroy the episode's sandbox and forget the task (the clean-start check rebuilds from here)."""
        self._release()
        self.task = None

    def close(self) -> None:
        self.full_reset()

    # -- for subclasses ---------------------------------------------------------------------------
    def parse(self, action: Action) -> tuple[list[ToolCall], list[str], bool]:
        """(tool calls, parse errors, episode finished)."""
        raise NotImplementedError

    def no_action_hint(self) -> str:
        return "no tool call found; call a tool or give the final answer"

    def _dispatch(self, call: ToolCall) -> Observation:
        handler = getattr(self, f"tool_{call.name}", None)
        known = [t["function"]["name"] for t in self.tools()]
        if handler is None or call.name not in known:
            return Observation(text=f"unknown tool {call.name!r}; tools: {', '.join(known)}", status="invalid_action")
        try:
            return handler(call.arguments)
        except (KeyError, TypeError, ValueError) as exc:
            return Observation(text=f"bad arguments for {call.name}: {exc}", status="invalid_action")

    def collect_files(self, paths) -> dict[str, bytes | None]:
        """Files of the episode's sandbox for verification, read without following links; a missing,
        linked or otherwise unsafe file is None (so a verifier sees it as absent, never as the host's)."""
        out: dict[str, bytes | None] = {}
        for path in paths:
            try:
                out[path] = self.sandbox.read_file(path, max_bytes=256 * 1024) if self.sandbox is not None else None
            except UnsafePath:
                out[path] = None
        return out

    def _release(self) -> None:
        if self.sandbox is not None:
            sb, self.sandbox = self.sandbox, None
            resources = getattr(sb, "resources", None)  # read before the provider destroys it
            self.episode_resources = resources() if resources is not None else None
            self.episode_provider().release(sb)

    def episode_provider(self) -> SandboxProvider:
        """Where the episode's sandbox comes from and goes back to: the harness's provider (a harness
        whose tasks run in images of their own overrides this)."""
        return self._provider

    def tools(self) -> list[dict]:  # pragma: no cover - abstract
        raise NotImplementedError


def image_digest_of(sandbox) -> str:
    """The digest of the image a sandbox runs in ("" = the host root): a local sandbox's settings name
    its image; the sandbox service's answer names the one it rooted it in."""
    return (getattr(sandbox, "image_digest", "") or getattr(getattr(sandbox, "settings", None), "image_digest", "") or "")


def call_result(call: ToolCall, observation: Observation) -> ToolCallResult:
    """A dispatched call as reported: its observation's status and text, the command's exit code and
    duration where it ran one."""
    exit_code = observation.info.get("exit_code")
    return ToolCallResult(name=call.name, arguments=dict(call.arguments) if isinstance(call.arguments, dict) else {}, status=observation.status,
                          latency_ms=1000.0 * float(observation.info.get("duration_s") or 0.0),
                          exit_code=exit_code if isinstance(exit_code, int) else None, output=observation.text)


def function_tool(name: str, description: str, properties: dict, required: list[str]) -> dict:
    """A JSON-schema tool spec in the shape chat templates take."""
    return {"type": "function", "function": {"name": name, "description": description,
                                             "parameters": {"type": "object", "properties": properties, "required": required}}}
