"""Where a harness gets its sandboxes: the `SandboxProvider` seam, a provider that starts one sandbox
per episode, `provider_from_config` choosing between it and the remote sandbox service, and a run's
per-harness providers (`HarnessSandboxes`: warm pools with each harness's limits).

Belongs here: the seam and the choice. The warm pool (`pool.py`) and the remote service client
(`remote.py`) are providers too; the harnesses only ever see the seam.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
import uuid
from collections import Counter, deque
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from agentrl_cli.envs.sandbox.orphans import reclaim_orphans
from agentrl_cli.envs.sandbox.sandbox import Sandbox, SandboxSettings

log = logging.getLogger("agentrl.sandbox")


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


def provider_from_config(sandbox_config, image: str = "", image_digest: str = "") -> SandboxProvider:
    """The remote sandbox service when sandbox.service_url is set (its replicas by sandbox.replica_url;
    sandboxes rooted in `image`, asked for by `image_digest`), else local sandboxes."""
    if sandbox_config.service_url:
        from agentrl_cli.envs.sandbox.remote import RemoteProvider
        from agentrl_cli.core.security.keys import client_key

        return RemoteProvider(sandbox_config.service_url, api_key=client_key(sandbox_config.api_key),
                              replica_url=sandbox_config.replica_url, image=image, image_digest=image_digest)
    return DirectProvider(SandboxSettings.from_config(sandbox_config))


def service_provider(sandbox_config, harness_config) -> SandboxProvider:
    """The sandbox service's provider for one harness: rooted in its image when it has one, asked for
    by digest (harnesses[].image_digest, else the digest of this client's copy), which the service
    is asked to prepare now: ImageError when it cannot provide it, never its host root instead."""
    if harness_config is None or not harness_config.image:
        return provider_from_config(sandbox_config)
    from agentrl_cli.envs.images import digest_of

    remote = provider_from_config(sandbox_config, harness_config.image, harness_config.image_digest or digest_of(harness_config.image))
    remote.prepare()
    return remote


def harness_settings(sandbox_config, harness_config) -> SandboxSettings:
    """The sandbox settings of one harness's environments: `sandbox.*`, with the harness's egress
    policy, its memory (`memory_gb`, when set) and its CPU quota (`cpu` cores, when set)."""
    s = SandboxSettings.from_config(sandbox_config).for_harness(harness_config)
    memory_mb = None if harness_config.memory_gb is None else max(16, int(harness_config.memory_gb * 1024))
    return replace(s, limits=s.limits.with_(memory_mb=memory_mb, cpu_cores=harness_config.cpu))


class TimedProvider:
    """A provider that records how long each acquire took (seconds, most recent first out)."""

    def __init__(self, inner: SandboxProvider, window: int = 4096) -> None:
        self.inner = inner
        self.acquire_s: deque[float] = deque(maxlen=window)
        self.failures: Counter = Counter()  # exception type -> count

    def acquire(self) -> Sandbox:
        t0 = time.perf_counter()
        try:
            sandbox = self.inner.acquire()
        except Exception as exc:  # noqa: BLE001 - counted, then raised to the harness
            self.failures[type(exc).__name__] += 1
            raise
        self.acquire_s.append(time.perf_counter() - t0)
        return sandbox

    def release(self, sandbox: Sandbox) -> None:
        self.inner.release(sandbox)


class HarnessSandboxes:
    """The sandboxes of a run's harnesses: per harness, a warm pool (`sandbox.pool_size` ready,
    at most the harness's `max_concurrency` or `sandbox.max_concurrency` alive, leases reclaimed after
    `sandbox.lease_timeout_s`) with that harness's limits; or the sandbox service at
    `sandbox.service_url`, which applies its own limits and roots the sandboxes of a harness with an
    image in that image's digest (harnesses[].image_digest, else read from the image here), or refuses. `close()` destroys every pool and returns
    their leak counters."""

    def __init__(self, config) -> None:
        self.config = config
        self.providers: dict[str, TimedProvider] = {}
        self._lock = threading.Lock()
        shared = Path(config.sandbox.root_dir).expanduser()
        # what runs killed before us left behind slows every sandbox started after it: reclaim it first
        self.reclaimed = reclaim_orphans(shared)
        if self.reclaimed["sandboxes"]:
            log.warning("reclaimed %s sandboxes left by processes that died (%s tmpfs mounts, %s cgroups, %s processes)",
                        self.reclaimed["sandboxes"], self.reclaimed["mounts"], self.reclaimed["cgroups"],
                        self.reclaimed["processes"])
        # this run's sandboxes live in a directory of their own, so what is left there is this run's leak
        self.root = shared / f"run-{uuid.uuid4().hex[:12]}"

    def for_harness(self, name: str) -> TimedProvider:
        with self._lock:
            if name not in self.providers:
                self.providers[name] = TimedProvider(self._make(name))
            return self.providers[name]

    def _make(self, name: str) -> SandboxProvider:
        sb = self.config.sandbox
        hc = next((h for h in self.config.harnesses if h.name == name), None)
        if sb.service_url:
            return service_provider(sb, hc)
        from agentrl_cli.envs.sandbox.pool import SandboxPool

        settings = replace(harness_settings(sb, hc) if hc is not None else SandboxSettings.from_config(sb), root_dir=self.root)
        limit = min(sb.max_concurrency, hc.max_concurrency) if hc is not None and hc.max_concurrency else sb.max_concurrency
        # a rollout returns sandboxes as its episodes end: start and destroy them in parallel, so the
        # pool keeps up with `limit` episodes rather than four at a time
        return SandboxPool(settings, size=sb.pool_size, max_concurrency=limit, lease_timeout_s=sb.lease_timeout_s,
                           workers=max(4, min(16, limit)))

    def metrics(self) -> dict:
        """`sandbox/<harness>/acquire_ms_p50|p99`, acquire failures by error, and each pool's counters."""
        out: dict = {"sandbox/reclaimed_orphans": self.reclaimed["sandboxes"]}
        for name, p in list(self.providers.items()):
            ordered = sorted(p.acquire_s)
            for q in (50, 99):
                out[f"sandbox/{name}/acquire_ms_p{q}"] = (round(ordered[min(len(ordered) - 1, q * len(ordered) // 100)] * 1000, 3)
                                                         if ordered else None)
            for error, n in p.failures.items():
                out[f"sandbox/{name}/acquire_failures/{error}"] = n
            counters = getattr(p.inner, "counters", None)
            if counters:
                out.update({f"sandbox/{name}/{k}": v for k, v in counters.items()})
        return out

    def close(self) -> dict:
        """Destroy every pool; returns what outlived them: `sandbox/leaked_processes` (processes that
        survived their sandbox) and `sandbox/leftover_dirs` (work directories left under
        `sandbox.root_dir`), both 0 when nothing leaked."""
        from agentrl_cli.envs.sandbox.pool import count_dirs

        leaked, pooled = 0, False
        for p in self.providers.values():
            close = getattr(p.inner, "close", None)
            final = close() if close is not None else None
            if isinstance(final, dict):
                pooled = True
                leaked += int(final.get("leaked_processes", 0))
        self.providers.clear()
        if not pooled:
            return {}
        leftover = count_dirs(self.root)
        shutil.rmtree(self.root, ignore_errors=True)
        return {"sandbox/leaked_processes": leaked, "sandbox/leftover_dirs": leftover}
