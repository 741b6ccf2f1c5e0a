"""The images the sandbox service runs: one warm pool per image digest, made on the first request
that names the digest (`POST /images` or `POST /sandboxes` with an image).

A client names an image by its reference and the digest it resolved (harnesses[].image_digest, or
what the client read from its own copy). The service finds that digest in its image cache
(sandbox.image_cache_dir: `<hex>/rootfs`, as `agentrl image unpack` or any earlier run wrote it,
e.g. a volume a cluster fills beforehand) or among the images its own config names
(harnesses[].image, read and verified here); otherwise it refuses (`ImageUnavailable`, HTTP 409)
naming the digest asked for and those it holds, and never runs the sandbox on its host's root.
The client's reference is only a name for messages: the service never opens a path a client
names, which would let a caller bind any directory of the service's host into a sandbox.
Belongs here: digest -> warm pool. Not here: the HTTP endpoints (`service.py`), unpacking (`envs/images`).
"""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from typing import Callable

from agentrl_cli.envs.images import ImageError, RootFS, cached, cached_digests, resolve
from agentrl_cli.envs.sandbox.pool import SandboxPool
from agentrl_cli.envs.sandbox.sandbox import SandboxSettings


class ImageUnavailable(ImageError):
    """The sandbox service holds no image with the digest a client asked for."""


class ServiceImages:
    """digest -> the warm pool of sandboxes rooted in that image. `configured`: the image references
    of the service's own config (harnesses[].image); `make_pool`: a pool for settings."""

    def __init__(self, settings: SandboxSettings, make_pool: Callable[[SandboxSettings], SandboxPool],
                 configured: tuple[str, ...] = ()) -> None:
        self.settings = settings
        self.make_pool = make_pool
        self.configured = tuple(dict.fromkeys(c for c in configured if c))
        self.pools: dict[str, SandboxPool] = {}
        self._lock = threading.Lock()

    @property
    def cache_dir(self) -> Path:
        return self.settings.image_cache_dir

    def pool(self, image: str, digest: str) -> SandboxPool:
        """The warm pool of `digest` (made now if new); ImageUnavailable when the service has no such image."""
        with self._lock:
            if digest in self.pools:
                return self.pools[digest]
            rootfs = self._find(image, digest)
            settings = replace(self.settings, image=rootfs.image, image_root=rootfs.path, image_digest=rootfs.digest)
            self.pools[digest] = pool = self.make_pool(settings)
            return pool

    def _find(self, image: str, digest: str) -> RootFS:
        named = image or digest
        if not digest:
            raise ImageUnavailable(named, "the client named no image digest, and the sandbox service runs an image only by digest",
                                   "set harnesses[].image_digest, or give the client a copy of the image to read it from")
        hit = cached(digest, self.cache_dir, image)
        if hit is not None:
            return hit
        found: dict[str, str] = {}
        for ref in self.configured:
            try:
                rootfs = resolve(ref, self.cache_dir)
            except ImageError as exc:
                found[ref] = f"unreadable here ({exc.reason})"
                continue
            if rootfs.digest == digest:
                return replace(rootfs, image=image or ref)
            found[ref] = rootfs.digest
        held = sorted(set(cached_digests(self.cache_dir)) | set(self.pools) | {d for d in found.values() if d.startswith(("sha256:", "dir-"))})
        configured = "; ".join(f"{ref} is {d}" for ref, d in found.items())
        raise ImageUnavailable(named, f"the sandbox service has no image with digest {digest}: it holds "
                               f"{', '.join(held) if held else 'none'} (cache {self.cache_dir}"
                               f"{'; configured: ' + configured if configured else ''})",
                               "unpack the image into the service's sandbox.image_cache_dir (`agentrl image unpack REF "
                               "--cache-dir DIR`) or name it in the service's harnesses[].image; never the host's root instead")

    def digests(self) -> list[str]:
        with self._lock:
            return sorted(set(self.pools) | set(cached_digests(self.cache_dir)))

    def metrics(self) -> dict[str, dict]:
        with self._lock:
            pools = dict(self.pools)
        return {digest: pool.metrics() for digest, pool in pools.items()}

    def close(self) -> dict:
        with self._lock:
            pools, self.pools = dict(self.pools), {}
        leaked = 0
        for pool in pools.values():
            leaked += int(pool.close().get("leaked_processes", 0))
        return {"leaked_processes": leaked}
