"""Where a harness gets its sandboxes: the `SandboxProvider` seam, a provider that starts one sandbox
per episode, and `provider_from_config` choosing between it and the remote sandbox service.

Belongs here: the seam and the choice. The warm pool (`pool.py`) and the remote service client
(`remote.py`) are providers too; the harnesses only ever see the seam.
"""

from __future__ import annotations

from typing import Protocol

from agentrl_cli.sandbox.sandbox import Sandbox, SandboxSettings


class SandboxProvider(Protocol):
    def acquire(self) -> Sandbox: ...
    def release(self, sandbox: Sandbox) -> None: ...


class DirectProvider:
    """Starts a sandbox per episode and destroys it on release (no pool)."""

    def __init__(self, settings: SandboxSettings | None = None) -> None:
        self.settings = settings or SandboxSettings()

    def acquire(self) -> Sandbox:
        return Sandbox(self.settings)

    def release(self, sandbox: Sandbox) -> None:
        sandbox.close()


def provider_from_config(sandbox_config) -> SandboxProvider:
    """The remote sandbox service when sandbox.service_url is set, else local sandboxes."""
    if sandbox_config.service_url:
        from agentrl_cli.sandbox.remote import RemoteProvider

        return RemoteProvider(sandbox_config.service_url)
    return DirectProvider(SandboxSettings.from_config(sandbox_config))
