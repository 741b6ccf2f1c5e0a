"""`harnesses[]`: each environment a run plays - its tasks, image, network, reward source, roles. One module per section; `agentrl_cli/config/models.py` joins them."""

from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic import Field, model_validator

from agentrl_cli.config.sections.base import (Section)


class HarnessConfig(Section):
    name: str = Field(..., min_length=1, description="Registered harness name (entry point agentrl.harnesses) or module:Class")
    image_tag: str = Field("pinned-2026-08-01", description="Label of the environment's version, recorded with every run; it selects nothing: the image the sandboxes run in is `image`, recorded by its digest (meta.json, each trajectory, the image lock)")
    image: str = Field("", description="Image the harness's sandboxes run in, as their read-only root: oci:PATH[:TAG] (an OCI layout directory), oci-archive:FILE[:TAG] (a tar of one) or docker-archive:FILE[:TAG] (what docker save writes; TAG one of its RepoTags) — digests verified at every load, unpacked once per digest into sandbox.image_cache_dir — or dir:PATH / an absolute path (a root filesystem directory); registry references are refused (none is reachable). '' = the host's system, read-only")
    image_digest: str = Field("", pattern=r"^((dir-)?sha256:[0-9a-f]{64})?$", description="The digest `image` must have (sha256:<manifest>, docker's image ID for a docker archive, dir-sha256:<listing> for a directory): an image that resolves to another is refused naming both. With the sandbox service (sandbox.service_url) it is what the service is asked for, so the client need not read the image itself; the rendered manifests fill it in. '' = whatever `image` holds now")
    cpu: float | None = Field(None, gt=0, le=256, description="CPU cores per environment instance: a cgroup CPU quota on each of this harness's sandboxes (None = no quota)")
    memory_gb: float | None = Field(None, gt=0, le=4096, description="Memory per environment instance: the memory limit of this harness's sandboxes (None = sandbox.memory_mb)")
    network: Literal["egress_deny_by_default", "allowlist"] = Field(
        "egress_deny_by_default", description="Sandbox egress policy: egress_deny_by_default = nothing outside the sandbox is reachable; allowlist = only the allowlist's endpoints")
    allowlist: list[str] = Field(default_factory=list, description="host:port endpoints reachable from the harness's sandboxes when network is allowlist (loopback addresses, or host names mapped inside); everything else stays unreachable")
    weight: float = Field(1.0, ge=0, description="Share of training episodes drawn from this harness")
    held_out: bool = Field(False, description="Never trained on; evaluated to detect learning of interface conventions")
    max_concurrency: int | None = Field(None, ge=1, description="Cap on this harness's instances in flight (None = rollout.concurrency)")
    options: dict = Field(default_factory=dict, description="Harness-specific options passed to its constructor")
    reward: Literal["verifiers", "harness", "mix"] | None = Field(
        None, description="Where this harness's training reward comes from: verifiers = the task's verifier (meta.verify); harness = the harness's own compute_reward; mix = the verifier's outcome plus compute_reward's score as the `harness` component, weighted by reward.weights.harness; None = the harness class's reward_source, else verifiers")
    roles: dict[str, str] = Field(default_factory=dict, description="Who plays each role of a multi-agent harness (one that declares roles): role -> policy (the policy under training; self-play when several roles are), scripted (the harness's scripted_move) or the URL of an inference server with the policy's tokenizer (a fixed opponent, never trained); a role not named is policy; refused for a harness without roles")
    tasks: str | None = Field(None, description="Tasks of this harness: a JSONL or Parquet file (local path or s3://bucket/key) with task_id, prompt, answer, split and optional difficulty, meta (None = the harness's own task_set(), else the committed task set)")

    @model_validator(mode="after")
    def _allowlist_valid(self) -> "HarnessConfig":
        if self.image_digest and not self.image:
            raise ValueError(f"harness {self.name!r}: image_digest is set but image is not; set image to the image "
                             "that digest names, or remove image_digest")
        if self.allowlist and self.network != "allowlist":
            raise ValueError(f"harness {self.name!r}: allowlist is set but network is {self.network!r}; "
                             "set network: allowlist for it to take effect, or remove the allowlist")
        for entry in self.allowlist:
            host, sep, port = entry.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"harness {self.name!r}: allowlist entry {entry!r} is not host:port (e.g. 127.0.0.1:8080)")
            if int(port) < 1024:
                raise ValueError(f"harness {self.name!r}: allowlist entry {entry!r}: ports below 1024 cannot be opened inside "
                                 "the sandbox (its user holds no capabilities); serve it at a port >= 1024")
            try:
                ip = ipaddress.ip_address(host.strip("[]"))
            except ValueError:
                continue  # a host name: mapped to a loopback address inside the sandbox
            if not (ip.is_loopback and ip.version == 4):
                raise ValueError(f"harness {self.name!r}: allowlist entry {entry!r}: the sandbox has no route to "
                                 "non-loopback addresses; name the host instead (it is mapped inside), or use 127.x")
        return self


def _default_harnesses() -> list[HarnessConfig]:
    return [
        HarnessConfig(name="terminal_like"),
        HarnessConfig(name="code_sandbox_like"),
        HarnessConfig(name="tool_api_like", held_out=True, weight=0.0),
    ]
