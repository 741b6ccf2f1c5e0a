"""ExecResult: what one command in a sandbox did, with the reason it was stopped if it was."""

from __future__ import annotations

import signal
from dataclasses import asdict, dataclass, field


@dataclass
class ExecResult:
    exit_code: int | None
    stdout: str = ""
    stderr: str = ""
    truncated: bool = False  # output went past the cap; the command was stopped
    timed_out: bool = False  # wall clock or CPU time ran out
    killed_reason: str | None = None  # "wall_timeout" | "cpu_time" | "memory" | "output_limit" | "sandbox_lost"
    duration_s: float = 0.0
    cpu_s: float = 0.0
    max_rss_kb: int = 0
    limits_hit: dict = field(default_factory=dict)  # e.g. {"processes": 3}
    error: str | None = None  # the sandbox could not run the command at all

    @property
    def status(self) -> str:
        """Observation status: ok (exit 0), timeout, or error (anything else)."""
        if self.timed_out:
            return "timeout"
        return "ok" if self.exit_code == 0 and self.error is None and self.killed_reason is None else "error"

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def to_dict(self) -> dict:
        return {**asdict(self), "status": self.status}

    @classmethod
    def from_supervisor(cls, resp: dict) -> "ExecResult":
        sig = resp.get("signal")
        reason = None
        if resp.get("timed_out"):
            reason = "wall_timeout"
        elif sig == signal.SIGXCPU:
            reason = "cpu_time"
        elif resp.get("truncated"):
            reason = "output_limit"
        return cls(exit_code=resp.get("exit_code"), stdout=resp.get("stdout", ""), stderr=resp.get("stderr", ""),
                   truncated=bool(resp.get("truncated")), timed_out=reason in ("wall_timeout", "cpu_time"),
                   killed_reason=reason, duration_s=resp.get("duration_s", 0.0), cpu_s=resp.get("cpu_s", 0.0),
                   max_rss_kb=resp.get("max_rss_kb", 0), error=resp.get("error"))
