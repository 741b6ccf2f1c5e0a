"""`sandbox`: the sandboxes episodes run in - isolation, limits, pool. One module per section; `agentrl_cli/config/models.py` joins them."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, SecretStr, field_validator

from agentrl_cli.config.sections.base import (Section)

REPLICA_NAME = re.compile(r"(?=.{1,63}$)[a-z0-9]([a-z0-9.-]*[a-z0-9])?")  # a host name: a pod's, or an address


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
    replica_url: str = Field("", description="Several sandbox service replicas: the URL of one replica, with {replica} for the name it gives its sandboxes (sandbox.replica); each sandbox's calls after creation go there, creation goes to sandbox.service_url (any replica). The rendered config sets http://{replica}.agentrl-sandbox-headless.<namespace>-sandbox.svc:8700. '' = every call to sandbox.service_url (one replica)")
    replica: str = Field("", description="`agentrl serve sandbox`: this replica's name (a host name: letters, digits, '-', '.'), put in the id of every sandbox it creates so clients send that sandbox's calls back to it (sandbox.replica_url); the rendered StatefulSet passes each pod's name. '' = one replica, plain ids")
    bwrap: str = Field("bwrap", description="bubblewrap executable (name on PATH or a path)")
    python: str = Field("/usr/bin/python3", description="Interpreter inside the sandbox (must live under /usr, which is bound read-only)")
    workdir_size_mb: int = Field(64, ge=1, description="Size of each sandbox's work directory (a tmpfs when running as root)")
    image_cache_dir: str = Field("/var/tmp/agentrl-images", description="Where images (harnesses[].image, `sandbox run --image`) are unpacked, one directory per manifest digest; the sandbox user must be able to traverse it (so not root's home)")
    root_dir: str = Field("/tmp/agentrl-sandboxes", description="Host directory holding the sandboxes' work directories")
    lease_timeout_s: float = Field(600.0, gt=0, description="A sandbox held longer than this is reclaimed by force")
    api_key: SecretStr | None = Field(None, description="Bearer key(s) the sandbox service requires and sandbox.service_url clients send, one per line: the first is sent, every one is accepted (rotation: `agentrl secrets rotate`); give it by AGENTRL_SANDBOX__API_KEY_FILE, never argv. Without one the service refuses to start unless bound to loopback with --insecure-loopback")

    @field_validator("replica_url")
    @classmethod
    def _replica_url_names_the_replica(cls, url: str, info) -> str:
        if not url:
            return url
        if not info.data.get("service_url"):  # service_url is validated first (field order)
            raise ValueError("routes the calls of sandbox.service_url's sandboxes, but sandbox.service_url is not set; "
                             "set it to the replicas' load-balanced address, or remove sandbox.replica_url")
        if url.count("{replica}") != 1 or "{" in url.replace("{replica}", "") or "}" in url.replace("{replica}", ""):
            raise ValueError(f"must hold {{replica}} once and no other braces, got {url!r}; "
                             "e.g. http://{replica}.agentrl-sandbox-headless.rl-sandbox.svc:8700")
        return url

    @field_validator("replica")
    @classmethod
    def _replica_is_a_host_name(cls, name: str) -> str:
        if name and not REPLICA_NAME.fullmatch(name):
            raise ValueError(f"must be a host name (lowercase letters, digits, '-' and '.', at most 63 characters), got {name!r}; "
                             "use the pod's name (agentrl-sandbox-0) or leave it '' for one replica")
        return name
