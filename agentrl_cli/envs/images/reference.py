"""Image references: what `harnesses[].image` and `agentrl sandbox run --image` accept.

- `oci:PATH[:TAG]`: an OCI image layout directory (`oci-layout`, `index.json`, `blobs/sha256/`);
  TAG picks the manifest annotated `org.opencontainers.image.ref.name` (optional when there is one).
- `oci-archive:FILE[:TAG]`: a tar of an OCI image layout (what `skopeo copy ... oci-archive:FILE:TAG`
  writes), read in place member by member; TAG as for a layout.
- `docker-archive:FILE[:TAG]`: what `docker save` writes (`manifest.json`, a config, layer tars,
  gzip'd or not); TAG picks the image by one of its `RepoTags` (`busybox:1.36`, optional when the
  archive holds one image).
- `dir:PATH` or an absolute path: a plain root filesystem directory, used in place (not copied).
  Its digest is `dir-sha256:` + the sha256 of its listing (`dir_digest`): every path in sorted
  order with its type, mode, size, mtime and link target, so any change to a file changes it.
- Anything else names a registry image: refused, since no registry is reachable from here.
Belongs here: parsing and the errors. Not here: reading a layout (`oci.py`), unpacking (`unpack.py`).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from agentrl_cli.core.errors import AgentrlError

REGISTRY_FIX = ("no registry is reachable from here: save the image where one is (`skopeo copy docker://REF oci:DIR:TAG`, "
                "`skopeo copy docker://REF oci-archive:FILE:TAG` or `docker save REF -o FILE`), copy it here and set the "
                "image to oci:DIR:TAG, oci-archive:FILE:TAG or docker-archive:FILE")


class ImageError(AgentrlError):
    """An image cannot be found, read, verified or unpacked: the sandbox refuses to start in it."""

    def __init__(self, image: str, reason: str, hint: str = "") -> None:
        super().__init__(f"image {image!r}: {reason}", hint)
        self.image = image
        self.reason = reason


class PathEscape(ImageError):
    """A layer member whose path (or hard link target) leaves the root: `..`, absolute, or through a symlink."""


class DigestMismatch(ImageError):
    """A blob whose sha256 is not the digest that names it."""


class DeviceNode(ImageError):
    """A layer holds a character or block device."""


class ImageNotFound(ImageError):
    """The image's directory, layout or tag does not exist."""


@dataclass(frozen=True)
class ImageRef:
    kind: str  # "oci" | "oci-archive" | "docker-archive" | "dir"
    path: Path
    tag: str | None
    text: str  # as the user wrote it, for messages


def parse(text: str) -> ImageRef:
    """The reference `text` names; ImageError for a registry reference or an empty one."""
    text = text.strip()
    if not text:
        raise ImageError(text, "empty image reference", "leave image unset for the host-rooted sandbox")
    if text.startswith("oci:"):
        rest = text[4:]
        path, sep, tag = rest.rpartition(":")
        if not sep or "/" in tag or not path or Path(rest).is_dir():
            path, tag = rest, ""
        return ImageRef("oci", Path(path).expanduser(), tag or None, text)
    for kind in ARCHIVES:
        if text.startswith(kind + ":"):
            path, tag = _archive_path(text[len(kind) + 1:])
            return ImageRef(kind, path, tag, text)
    if text.startswith("dir:") or text.startswith("/"):
        return ImageRef("dir", Path(text[4:] if text.startswith("dir:") else text).expanduser(), None, text)
    raise ImageError(text, "a registry reference, and images are not pulled", REGISTRY_FIX)


ARCHIVES = ("oci-archive", "docker-archive")


def _archive_path(rest: str) -> tuple[Path, str | None]:
    """FILE and TAG of `FILE[:TAG]`: split at the first colon after which FILE is an existing file
    (a docker tag holds colons itself: `a.tar:busybox:1.36`), else at the first colon after the
    file name's last slash."""
    for i, ch in enumerate(rest):
        if ch == ":" and Path(rest[:i]).expanduser().is_file():
            return Path(rest[:i]).expanduser(), rest[i + 1:] or None
    if Path(rest).expanduser().is_file():
        return Path(rest).expanduser(), None
    slash = rest.rfind("/", 0, rest.find(":") if ":" in rest else len(rest))
    path, sep, tag = rest[slash + 1:].partition(":")
    return Path(rest[:slash + 1] + path).expanduser(), (tag or None) if sep else None


def dir_digest(root: Path) -> str:
    """`dir-sha256:<hex>` of a root filesystem directory's listing (see the module docstring)."""
    h = hashlib.sha256()
    for top, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(dirs + files):
            p = os.path.join(top, name)
            st = os.lstat(p)
            link = os.readlink(p) if os.path.islink(p) else ""
            rel = os.path.relpath(p, root)
            h.update(f"{rel}\0{st.st_mode:o}\0{st.st_size}\0{st.st_mtime_ns}\0{link}\n".encode("utf-8", "surrogateescape"))
    return "dir-sha256:" + h.hexdigest()
