"""Reading an OCI image layout with every digest verified: the index's manifest entry, the manifest,
its config and each layer are checked against the sha256 that names them before anything uses them
(a mismatch is refused naming the blob). A nested index picks this host's platform.
Belongs here: the layout's files and digests. Not here: unpacking layers (`unpack.py`).
"""

from __future__ import annotations

import hashlib
import json
import platform
import re
from dataclasses import dataclass
from pathlib import Path

from agentrl_cli.envs.images.reference import DigestMismatch, ImageError, ImageNotFound, ImageRef

DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
INDEX_TYPES = ("application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json")
REF_NAME = "org.opencontainers.image.ref.name"
ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
MAX_JSON = 4 << 20


@dataclass(frozen=True)
class Layer:
    digest: str
    media_type: str
    path: Path  # the verified blob


@dataclass(frozen=True)
class Manifest:
    digest: str  # sha256:<hex> of the manifest: the image's identity in the cache
    config: dict
    layers: tuple[Layer, ...]


def blob_path(ref: ImageRef, digest: str) -> Path:
    if not isinstance(digest, str) or not DIGEST.fullmatch(digest):
        raise ImageError(ref.text, f"unsupported or malformed digest {digest!r} (only sha256 is read)")
    return ref.path / "blobs" / "sha256" / digest.split(":", 1)[1]


def verify_blob(ref: ImageRef, digest: str) -> Path:
    """The blob's path once its sha256 matches `digest` (streamed, any size)."""
    path = blob_path(ref, digest)
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    except OSError as exc:
        raise ImageNotFound(ref.text, f"blob {digest} cannot be read: {exc.strerror}") from None
    if "sha256:" + h.hexdigest() != digest:
        raise DigestMismatch(ref.text, f"digest mismatch in blob {digest}: its content hashes to sha256:{h.hexdigest()}",
                             "the layout is corrupt or was tampered with: copy it again from its source")
    return path


def _json_blob(ref: ImageRef, digest: str) -> dict:
    path = verify_blob(ref, digest)
    if path.stat().st_size > MAX_JSON:
        raise ImageError(ref.text, f"blob {digest} is too large for a manifest or config")
    try:
        doc = json.loads(path.read_bytes())
    except ValueError as exc:
        raise ImageError(ref.text, f"blob {digest} is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ImageError(ref.text, f"blob {digest} is not a JSON object")
    return doc


def _pick(ref: ImageRef, entries: list, nested: bool) -> dict:
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ImageError(ref.text, "index.json has no manifests list")
    if nested:
        fits = [e for e in entries if (e.get("platform") or {}).get("os", "linux") == "linux"
                and (e.get("platform") or {}).get("architecture", ARCH) == ARCH]
        if not fits:
            raise ImageNotFound(ref.text, f"no manifest for linux/{ARCH} in its index")
        return fits[0]
    tags = [(e.get("annotations") or {}).get(REF_NAME) for e in entries]
    if ref.tag is not None:
        fits = [e for e, t in zip(entries, tags) if t == ref.tag]
        if not fits:
            raise ImageNotFound(ref.text, f"no manifest tagged {ref.tag!r}; tags here: {[t for t in tags if t] or 'none'}")
        return fits[0]
    if len(entries) != 1:
        raise ImageError(ref.text, f"the layout holds {len(entries)} manifests: name one",
                         f"use oci:{ref.path}:TAG with TAG one of {[t for t in tags if t]}")
    return entries[0]


def read_manifest(ref: ImageRef) -> Manifest:
    """The image's manifest, config and layers, every blob's digest verified, at every load (also
    when the image is already unpacked: a layout changed since is refused, not run from the cache;
    sha256 reads about 1 GB/s); ImageError otherwise."""
    if not ref.path.is_dir():
        raise ImageNotFound(ref.text, f"no OCI layout directory at {ref.path}",
                            "check the path, or save the image there as an OCI layout")
    try:
        index = json.loads((ref.path / "index.json").read_bytes())
    except (OSError, ValueError) as exc:
        raise ImageNotFound(ref.text, f"{ref.path} is not an OCI layout (index.json: {exc})") from None
    entry = _pick(ref, index.get("manifests") if isinstance(index, dict) else None, nested=False)
    for _ in range(2):  # an index may point to a per-platform index
        if entry.get("mediaType") not in INDEX_TYPES:
            break
        entry = _pick(ref, _json_blob(ref, entry.get("digest")).get("manifests"), nested=True)
    digest = entry.get("digest")
    manifest = _json_blob(ref, digest)
    config_desc, layer_descs = manifest.get("config"), manifest.get("layers")
    if not isinstance(config_desc, dict) or not isinstance(layer_descs, list):
        raise ImageError(ref.text, f"manifest {digest} has no config or layers")
    config = _json_blob(ref, config_desc.get("digest"))
    if config.get("os", "linux") != "linux":
        raise ImageError(ref.text, f"image is for {config.get('os')}, not linux")
    layers = []
    for d in layer_descs:
        if not isinstance(d, dict):
            raise ImageError(ref.text, f"manifest {digest} has a malformed layer entry")
        layers.append(Layer(d.get("digest"), str(d.get("mediaType", "")), verify_blob(ref, d.get("digest"))))
    return Manifest(digest, config, tuple(layers))
