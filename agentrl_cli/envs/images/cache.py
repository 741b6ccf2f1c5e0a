"""The content-addressed cache of unpacked images: `<cache_dir>/<manifest sha256 hex>/rootfs`.

An image is unpacked once per manifest digest: its layers verified, then applied into a temporary
directory beside the cache entry, which is renamed into place only when complete; concurrent
unpackers each build their own and the first rename wins, so no reader sees a partial root. The
cache and each root are traversable by others (0711, 0755): the sandbox's bubblewrap runs as the
sandbox user and must reach the root it binds. The default lives under /var/tmp rather than
`~/.cache` for that reason (root's home is closed to other users).
Belongs here: resolving a reference to a root directory. Not here: mounting it (`envs/sandbox/bwrap.py`).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from agentrl_cli.envs.images import archive, oci, unpack
from agentrl_cli.envs.images.reference import ImageError, ImageNotFound, ImageRef, dir_digest, parse

DEFAULT_CACHE_DIR = "/var/tmp/agentrl-images"


@dataclass(frozen=True)
class RootFS:
    image: str  # the reference as written
    digest: str  # sha256:<manifest> for an OCI image (layout or archive), sha256:<config> (docker's image ID)
    # for a docker archive, dir-sha256:<listing> for a directory
    path: Path  # the root directory sandboxes bind read-only at /


def resolve(image: str, cache_dir: str | Path = DEFAULT_CACHE_DIR) -> RootFS:
    """The root filesystem of `image`, unpacked into the cache if it is not there yet; ImageError
    (exit 2, naming the image and the reason) when it cannot be found, verified or unpacked."""
    ref = parse(image)
    if ref.kind == "dir":
        if not ref.path.is_dir():
            raise ImageNotFound(image, f"no root filesystem directory at {ref.path}")
        return RootFS(image, dir_digest(ref.path), ref.path.resolve())
    manifest = read_image(ref)
    cache = Path(cache_dir).expanduser()
    entry = cache / manifest.digest.split(":", 1)[1]
    if not (entry / "rootfs").is_dir():
        _unpack(ref, manifest, cache, entry)
    return RootFS(image, manifest.digest, entry / "rootfs")


def digest_of(image: str) -> str:
    """The digest `image` has now (its source read and verified, nothing unpacked); ImageError when
    it cannot be found or verified."""
    ref = parse(image)
    if ref.kind == "dir":
        if not ref.path.is_dir():
            raise ImageNotFound(image, f"no root filesystem directory at {ref.path}")
        return dir_digest(ref.path)
    return read_image(ref).digest


def read_image(ref: ImageRef) -> oci.Manifest:
    """The verified manifest of a layout (`oci:`) or an archive (`oci-archive:`, `docker-archive:`)."""
    return oci.read_manifest(ref) if ref.kind == "oci" else archive.read_archive(ref)


def cached(digest: str, cache_dir: str | Path = DEFAULT_CACHE_DIR, image: str = "") -> RootFS | None:
    """The root already unpacked for `digest` (sha256:...) in the cache, or None. The cache is trusted
    as written by `resolve` (named by the digest it verified): it is how a host that has no copy of
    the image's source (a sandbox service pod) runs it."""
    if not digest.startswith("sha256:") or not oci.DIGEST.fullmatch(digest):
        return None
    root = Path(cache_dir).expanduser() / digest.split(":", 1)[1] / "rootfs"
    return RootFS(image or digest, digest, root) if root.is_dir() else None


def cached_digests(cache_dir: str | Path = DEFAULT_CACHE_DIR) -> list[str]:
    """The digests unpacked in the cache."""
    cache = Path(cache_dir).expanduser()
    try:
        return sorted(f"sha256:{p.name}" for p in cache.iterdir() if not p.name.startswith(".") and (p / "rootfs").is_dir())
    except OSError:
        return []


def _unpack(ref: ImageRef, manifest: oci.Manifest, cache: Path, entry: Path) -> None:
    try:
        cache.mkdir(parents=True, exist_ok=True)
        os.chmod(cache, 0o711)
        tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name[:12]}-", dir=cache))
    except OSError as exc:
        raise ImageError(ref.text, f"cannot create the image cache {cache}: {exc}",
                         "set sandbox.image_cache_dir to a writable directory") from None
    try:
        root = tmp / "rootfs"
        root.mkdir()
        dir_modes: dict[Path, int] = {}
        for layer in manifest.layers:
            if "zstd" in layer.media_type:
                raise ImageError(ref.text, f"layer {layer.digest} is zstd-compressed, which is not read here",
                                 "save the image with gzip or uncompressed layers")
            unpack.apply_layer(ref.text, layer.digest, layer.open, root, dir_modes)
        unpack.finish(dir_modes)
        os.chmod(root, 0o755)
        os.chmod(tmp, 0o711)
        (tmp / "image.json").write_text(json.dumps({"image": ref.text, "digest": manifest.digest,
                                                    "layers": [la.digest for la in manifest.layers]}, indent=1))
        try:
            tmp.rename(entry)
        except OSError:
            if not (entry / "rootfs").is_dir():
                raise
    except OSError as exc:
        raise ImageError(ref.text, f"cannot unpack into {cache}: {exc}") from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


__all__ = ["DEFAULT_CACHE_DIR", "ImageNotFound", "RootFS", "cached", "cached_digests", "digest_of", "resolve"]
