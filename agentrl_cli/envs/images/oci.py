"""Reading an OCI image layout with every digest verified: the index's manifest entry, the manifest,
its config and each layer are checked against the sha256 that names them before anything uses them
(a mismatch is refused naming the blob). A nested index picks this host's platform. The layout is a
directory (`oci:`) or a tar of one (`oci-archive:`, read member by member through `archive.py`);
docker archives are `archive.py`'s.
Belongs here: the layout's files and digests. Not here: unpacking layers (`unpack.py`).
"""

from __future__ import annotations

import hashlib
import json
import platform
import re
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Protocol

from agentrl_cli.envs.images.reference import DigestMismatch, ImageError, ImageNotFound, ImageRef

DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
INDEX_TYPES = ("application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json")
REF_NAME = "org.opencontainers.image.ref.name"
ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
MAX_JSON = 4 << 20


class Blobs(Protocol):
    """Where a layout's files are read from: `open("index.json")`, `open("blobs/sha256/<hex>")`
    (FileNotFoundError when absent)."""

    def open(self, name: str) -> BinaryIO: ...


class LayoutDir:
    def __init__(self, root: Path) -> None:
        self.root = root

    def open(self, name: str) -> BinaryIO:
        return open(self.root / name, "rb")


@dataclass(frozen=True)
class Layer:
    digest: str
    media_type: str
    open: Callable[[], BinaryIO]  # the verified blob (a tar, gzip'd or not)


@dataclass(frozen=True)
class Manifest:
    digest: str  # sha256:<hex> of the manifest: the image's identity in the cache
    config: dict
    layers: tuple[Layer, ...]


def blob_name(ref: ImageRef, digest: str) -> str:
    if not isinstance(digest, str) or not DIGEST.fullmatch(digest):
        raise ImageError(ref.text, f"unsupported or malformed digest {digest!r} (only sha256 is read)")
    return "blobs/sha256/" + digest.split(":", 1)[1]


def sha256_of(ref: ImageRef, what: str, opener: Callable[[], BinaryIO]) -> str:
    """sha256:<hex> of what `opener` reads (streamed, any size); ImageNotFound when it cannot be read."""
    h = hashlib.sha256()
    try:
        with opener() as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    except OSError as exc:
        raise ImageNotFound(ref.text, f"{what} cannot be read: {exc.strerror or exc}") from None
    return "sha256:" + h.hexdigest()


def verify_blob(ref: ImageRef, blobs: Blobs, digest: str) -> Callable[[], BinaryIO]:
    """An opener of the blob once its sha256 matches `digest`."""
    name = blob_name(ref, digest)
    opener = lambda: blobs.open(name)  # noqa: E731
    actual = sha256_of(ref, f"blob {digest}", opener)
    if actual != digest:
        raise DigestMismatch(ref.text, f"digest mismatch in blob {digest}: its content hashes to {actual}",
                             "the image is corrupt or was tampered with: copy it again from its source")
    return opener


def json_doc(ref: ImageRef, what: str, opener: Callable[[], BinaryIO]) -> dict:
    try:
        with opener() as f:
            data = f.read(MAX_JSON + 1)
    except OSError as exc:
        raise ImageNotFound(ref.text, f"{what} cannot be read: {exc.strerror or exc}") from None
    if len(data) > MAX_JSON:
        raise ImageError(ref.text, f"{what} is too large for a manifest or config")
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise ImageError(ref.text, f"{what} is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ImageError(ref.text, f"{what} is not a JSON object")
    return doc


def _json_blob(ref: ImageRef, blobs: Blobs, digest: str) -> dict:
    return json_doc(ref, f"blob {digest}", verify_blob(ref, blobs, digest))


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
                         f"use {ref.kind}:{ref.path}:TAG with TAG one of {[t for t in tags if t]}")
    return entries[0]


def read_manifest(ref: ImageRef) -> Manifest:
    """The manifest, config and layers of the OCI layout directory `ref` names, every blob's digest
    verified, at every load (also when the image is already unpacked: a layout changed since is
    refused, not run from the cache; sha256 reads about 1 GB/s); ImageError otherwise."""
    if not ref.path.is_dir():
        raise ImageNotFound(ref.text, f"no OCI layout directory at {ref.path}",
                            "check the path, or save the image there as an OCI layout")
    return read_layout(ref, LayoutDir(ref.path))


def read_layout(ref: ImageRef, blobs: Blobs) -> Manifest:
    """The manifest of the layout `blobs` reads from (a directory, or a tar of one)."""
    where = "the archive" if ref.kind == "oci-archive" else str(ref.path)
    try:
        with blobs.open("index.json") as f:
            index = json.loads(f.read(MAX_JSON))
    except (OSError, ValueError) as exc:
        raise ImageNotFound(ref.text, f"{where} is not an OCI layout (index.json: {exc})") from None
    entry = _pick(ref, index.get("manifests") if isinstance(index, dict) else None, nested=False)
    for _ in range(2):  # an index may point to a per-platform index
        if entry.get("mediaType") not in INDEX_TYPES:
            break
        entry = _pick(ref, _json_blob(ref, blobs, entry.get("digest")).get("manifests"), nested=True)
    digest = entry.get("digest")
    manifest = _json_blob(ref, blobs, digest)
    config_desc, layer_descs = manifest.get("config"), manifest.get("layers")
    if not isinstance(config_desc, dict) or not isinstance(layer_descs, list):
        raise ImageError(ref.text, f"manifest {digest} has no config or layers")
    config = _json_blob(ref, blobs, config_desc.get("digest"))
    if config.get("os", "linux") != "linux":
        raise ImageError(ref.text, f"image is for {config.get('os')}, not linux")
    layers = []
    for d in layer_descs:
        if not isinstance(d, dict):
            raise ImageError(ref.text, f"manifest {digest} has a malformed layer entry")
        layers.append(Layer(d.get("digest"), str(d.get("mediaType", "")), verify_blob(ref, blobs, d.get("digest"))))
    return Manifest(digest, config, tuple(layers))
