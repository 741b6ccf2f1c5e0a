"""`sandbox`: the sandboxes episodes run in - isolation, limits, pool. One module per section; `agentrl_cli/config/models.py` joins them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr

from agentrl_cli.config.sections.base import (Section)


class SandboxConfig(Section):
    backend: Literal["bwrap", "process"] = Field("bwrap", description="bwrap = bubblewrap isolation; process = NO isolation (explicit opt-out)")
    host: str = Field("127.0.0.1", description="Address `agentrl serve sandbox` binds (loopback by default; the rendered sandbox pod passes 0.0.0.0)")
    pool_size: int = Field(8, ge=0, description="Warm sandboxes kept ready")
    max_concurrency: int = Field(64, ge=1, description="Most sandboxes alive at once")
    wall_timeout_s: float = Field(30.0, gt=0, description="Wall-clock deadline per command; the process group is killed")
    cpu_time_s: int = Field(10, ge=1, description="CPU-time limit per command (RLIMIT_CPU)")
    memory_mb: int = Field(512, ge=16, description="Memory limit per sandbox")
    max_processes: int = Field(64, ge=1, description="Process limit per sandbox")
    max_file_size_mb: int = Field(64, ge=1, description="Largest file a sandbox may write")
    max_open_files: int = Field(256, ge=16, description="Open file descriptor limit")
    tmpfs_size_mb: int = Field(64, ge=1, description="Size of the sandbox's /tmp")
    output_limit_bytes: int = Field(1_048_576, ge=1024, description="Output captured per command; the rest is dropped and flagged")
    seccomp: bool = Field(True, description="Load the seccomp filter when libseccomp is available")
    service_url: str | None = Field(None, description="Use a remote sandbox service (agentrl serve sandbox) instead of the local pool")
    bwrap: str = Field("bwrap", description="bubblewrap executable (name on PATH or a path)")
    python: str = Field("/usr/bin/python3", description="Interpreter inside the sandbox (must live under /usr, which is bound read-only)")
    workdir_size_mb: int = Field(64, ge=1, description="Size of each sandbox's work directory (a tmpfs when running as root)")
    root_dir: str = Field("/tmp/agentrl-sandboxes", description="Host directory holding the sandboxes' work directories")
    lease_timeout_s: float = Field(600.0, gt=0, description="A sandbox held longer than this is reclaimed by force")
    api_key: SecretStr | None = Field(None, description="Bearer key(s) the sandbox service requires and sandbox.service_url clients send, one per line: the first is sent, every one is accepted (rotation: `agentrl secrets rotate`); give it by AGENTRL_SANDBOX__API_KEY_FILE, never argv. Without one the service refuses to start unless bound to loopback with --insecure-loopback")
