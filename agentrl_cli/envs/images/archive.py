"""Images as one file: an OCI archive (a tar of an OCI layout, `oci-archive:`) and a docker archive
(what `docker save` writes, `docker-archive:`), read in place member by member, never extracted.

`TarMembers` indexes the archive's regular files once (a symlink or hard link member, as `docker
save` writes for a layer shared by two images, is followed inside the archive only); each read
opens the file and seeks to the member. An archive that is itself gzip'd is read the same way,
decompressing as far as each member (slower, never wrong).

A docker archive carries no manifest digest: its image is named by its config's sha256 (docker's
image ID, `sha256:<config hex>`), and what pins the layers is the config's `rootfs.diff_ids`, the
sha256 of each layer's uncompressed tar. Both are verified at every load like a layout's blobs: the
config against the digest its file name carries (`<hex>.json` or `blobs/sha256/<hex>`), each layer
against its diff_id (and against its file name's digest when it has one); a config without diff_ids
for every layer is refused, since nothing would pin them.
Belongs here: reading the archive formats. Not here: verifying a layout (`oci.py`), unpacking (`unpack.py`).
"""

from __future__ import annotations

import gzip
import io
import json
import posixpath
import re
import tarfile
from pathlib import Path
from typing import BinaryIO, Callable

from agentrl_cli.envs.images.oci import DIGEST, Layer, Manifest, json_doc, read_layout, sha256_of
from agentrl_cli.envs.images.reference import DigestMismatch, ImageError, ImageNotFound, ImageRef

HEX_NAME = re.compile(r"(?:^|/)(?:blobs/sha256/)?([0-9a-f]{64})(?:\.json)?$")
DOCKER_LAYER = "application/vnd.docker.image.rootfs.diff.tar"


class _Slice(io.RawIOBase):
    """`size` bytes of `raw` from `start`, seekable (a layer's tar is opened with tarfile's `r:*`)."""

    def __init__(self, raw: BinaryIO, start: int, size: int) -> None:
        self.raw, self.start, self.size, self.pos = raw, start, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        n = min(len(buf), self.size - self.pos)
        if n <= 0:
            return 0
        self.raw.seek(self.start + self.pos)
        data = self.raw.read(n)
        buf[:len(data)] = data
        self.pos += len(data)
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def close(self) -> None:
        self.raw.close()
        super().close()


class TarMembers:
    """The regular files of a tar archive by name (`./` stripped), each opened at its offset."""

    def __init__(self, path: Path, gz: bool, files: dict[str, tuple[int, int]]) -> None:
        self.path, self.gz, self.files = path, gz, files

    @classmethod
    def index(cls, ref: ImageRef) -> "TarMembers":
        if not ref.path.is_file():
            raise ImageNotFound(ref.text, f"no archive file at {ref.path}",
                                "check the path, or save the image there (`skopeo copy` or `docker save`)")
        try:
            with open(ref.path, "rb") as f:
                gz = f.read(2) == b"\x1f\x8b"
            files: dict[str, tuple[int, int]] = {}
            links: dict[str, str] = {}
            with tarfile.open(ref.path, "r:*") as tar:
                for m in tar:
                    name = posixpath.normpath(m.name).lstrip("/")
                    if m.isreg():
                        files[name] = (m.offset_data, m.size)
                    elif m.issym():
                        links[name] = posixpath.normpath(posixpath.join(posixpath.dirname(name), m.linkname))
                    elif m.islnk():
                        links[name] = posixpath.normpath(m.linkname).lstrip("/")
        except (tarfile.TarError, EOFError, OSError) as exc:
            raise ImageError(ref.text, f"{ref.path} is not a readable tar archive: {exc}") from None
        for name, target in links.items():
            for _ in range(8):  # a link to a link, within the archive only
                target = links.get(target, target)
            if target in files:
                files.setdefault(name, files[target])
        return cls(ref.path, gz, files)

    def open(self, name: str) -> BinaryIO:
        name = posixpath.normpath(name).lstrip("/")
        if name not in self.files:
            raise FileNotFoundError(2, f"no member {name!r} in {self.path}")
        start, size = self.files[name]
        raw = gzip.open(self.path, "rb") if self.gz else open(self.path, "rb")
        return io.BufferedReader(_Slice(raw, start, size), 1 << 20)


def read_archive(ref: ImageRef) -> Manifest:
    """The manifest of an `oci-archive:` or `docker-archive:` image, verified as `oci.read_manifest`
    verifies a layout (at every load)."""
    members = TarMembers.index(ref)
    return read_layout(ref, members) if ref.kind == "oci-archive" else read_docker(ref, members)


def _uncompressed(opener: Callable[[], BinaryIO]) -> Callable[[], BinaryIO]:
    """An opener of the layer's tar stream: gunzipped when the layer is gzip'd."""

    def open_() -> BinaryIO:
        f = opener()
        head = f.peek(2)[:2] if hasattr(f, "peek") else b""
        return gzip.GzipFile(fileobj=f, mode="rb") if head == b"\x1f\x8b" else f

    return open_


def _named_digest(name: str) -> str | None:
    m = HEX_NAME.search(name)
    return f"sha256:{m.group(1)}" if m else None


def _pick(ref: ImageRef, entries: list) -> dict:
    if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
        raise ImageError(ref.text, "manifest.json lists no images")
    tags = [t for e in entries for t in (e.get("RepoTags") or [])]
    if ref.tag is None:
        if len(entries) != 1:
            raise ImageError(ref.text, f"the archive holds {len(entries)} images: name one",
                             f"use docker-archive:{ref.path}:TAG with TAG one of {tags}")
        return entries[0]
    for e in entries:
        for t in e.get("RepoTags") or []:
            if ref.tag in (t, t.rsplit("/", 1)[-1]) or (":" not in ref.tag and t.rsplit("/", 1)[-1] == f"{ref.tag}:latest"):
                return e
    raise ImageNotFound(ref.text, f"no image tagged {ref.tag!r}; tags here: {tags or 'none'}")


def read_docker(ref: ImageRef, members: TarMembers) -> Manifest:
    """The image of a docker archive, its config and every layer verified (see the module docstring)."""
    if "manifest.json" not in members.files:
        raise ImageNotFound(ref.text, f"{ref.path} is not a docker archive (no manifest.json)",
                            "an OCI archive is read as oci-archive:FILE[:TAG]")
    try:
        with members.open("manifest.json") as f:
            entries = json.loads(f.read(4 << 20))
    except ValueError as exc:
        raise ImageError(ref.text, f"manifest.json is not JSON: {exc}") from None
    entry = _pick(ref, entries)
    config_name, layer_names = entry.get("Config"), entry.get("Layers")
    if not isinstance(config_name, str) or not isinstance(layer_names, list) or not all(isinstance(n, str) for n in layer_names):
        raise ImageError(ref.text, "manifest.json's image has no Config or Layers")
    config_open = lambda: members.open(config_name)  # noqa: E731
    image_id = sha256_of(ref, f"config {config_name}", config_open)
    named = _named_digest(config_name)
    if named is not None and named != image_id:
        raise DigestMismatch(ref.text, f"digest mismatch in config {config_name}: its content hashes to {image_id}",
                             "the archive is corrupt or was tampered with: save it again from its source")
    config = json_doc(ref, f"config {config_name}", config_open)
    if config.get("os", "linux") != "linux":
        raise ImageError(ref.text, f"image is for {config.get('os')}, not linux")
    diff_ids = (config.get("rootfs") or {}).get("diff_ids") if isinstance(config.get("rootfs"), dict) else None
    if not isinstance(diff_ids, list) or len(diff_ids) != len(layer_names) or not all(
            isinstance(d, str) and DIGEST.fullmatch(d) for d in diff_ids):
        raise ImageError(ref.text, f"config {config_name} has no sha256 diff_id for each of its {len(layer_names)} layers, "
                         "so its layers cannot be verified", "save the image again with `docker save` or `skopeo copy`")
    layers = []
    for name, diff_id in zip(layer_names, diff_ids):
        opener = lambda name=name: members.open(name)  # noqa: E731
        named = _named_digest(name)
        if named is not None and named != diff_id:  # docker 25+ names compressed or not; check the bytes when it differs
            actual = sha256_of(ref, f"layer {name}", opener)
            if actual != named:
                raise DigestMismatch(ref.text, f"digest mismatch in layer {name}: its content hashes to {actual}",
                                     "the archive is corrupt or was tampered with: save it again from its source")
        tar_stream = _uncompressed(opener)
        actual = _tar_digest(ref, name, tar_stream)
        if actual != diff_id:
            raise DigestMismatch(ref.text, f"digest mismatch in layer {name}: its tar hashes to {actual}, "
                                 f"the config's diff_id is {diff_id}",
                                 "the archive is corrupt or was tampered with: save it again from its source")
        layers.append(Layer(diff_id, DOCKER_LAYER, opener))
    return Manifest(image_id, config, tuple(layers))


def _tar_digest(ref: ImageRef, name: str, opener: Callable[[], BinaryIO]) -> str:
    try:
        return sha256_of(ref, f"layer {name}", opener)
    except (EOFError, gzip.BadGzipFile) as exc:
        raise ImageError(ref.text, f"layer {name} is a damaged gzip stream: {exc}") from None


__all__ = ["TarMembers", "read_archive", "read_docker"]
