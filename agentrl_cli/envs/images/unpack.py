"""Applying an image's layers to a directory, strictly.

Each member's path is split into parts: `..`, an absolute path or a parent that is a symlink (laid
by an earlier member or layer) is a `PathEscape`; so is a hard link whose target is. Symlinks are
created as they are, absolute targets included: nothing here follows them, and inside the sandbox
they resolve against the image's root. Whiteouts (`.wh.NAME`) remove NAME from the layers below; an
opaque marker (`.wh..wh..opq`) empties its directory of what the layers below put there. Character
and block devices are a `DeviceNode` error. Ownership is not kept (files belong to the unpacking
user, and appear inside the sandbox as its unmapped `nobody`); setuid and setgid bits are dropped,
since the sandbox mounts the image nosuid and the bits could only grant rights on the host.
Belongs here: tar members to files. Not here: digests (`oci.py`), the cache (`cache.py`).
"""

from __future__ import annotations

import os
import shutil
import stat
import tarfile
from pathlib import Path
from typing import BinaryIO, Callable

from agentrl_cli.envs.images.reference import DeviceNode, ImageError, PathEscape

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
KEEP_BITS = 0o1777  # rwx for all, and sticky; never setuid/setgid


def _parts(image: str, name: str, what: str) -> list[str]:
    if name.startswith("/"):
        raise PathEscape(image, f"layer {what} {name!r} is an absolute path that escapes the image root")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise PathEscape(image, f"layer {what} {name!r} escapes the image root with '..'")
    return parts


def _parent(image: str, root: Path, parts: list[str], name: str) -> Path:
    """The member's parent directory, made as needed, after checking no part of it is a symlink."""
    d = root
    for i, part in enumerate(parts[:-1]):
        d = d / part
        try:
            st = os.lstat(d)
        except FileNotFoundError:
            os.mkdir(d, 0o755)
            continue
        if stat.S_ISLNK(st.st_mode):
            raise PathEscape(image, f"layer member {name!r} passes through the symlink {'/'.join(parts[:i + 1])!r}")
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(d)
            os.mkdir(d, 0o755)
    return d


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    elif os.path.lexists(p):
        os.unlink(p)


def apply_layer(image: str, layer: str, blob: Callable[[], BinaryIO], root: Path, dir_modes: dict[Path, int]) -> None:
    """Apply one layer (a tar, gzip'd or not, that `blob` opens; `layer` names it) to `root`.
    Directory modes are collected in `dir_modes` and set by the caller after the last layer."""
    this_layer: set[Path] = set()
    try:
        with blob() as f, tarfile.open(fileobj=f, mode="r:*") as tar:
            for m in tar:
                _member(image, tar, m, root, this_layer, dir_modes)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise ImageError(image, f"layer {layer} cannot be unpacked: {exc}") from None


def _member(image: str, tar: tarfile.TarFile, m: tarfile.TarInfo, root: Path, this_layer: set[Path],
            dir_modes: dict[Path, int]) -> None:
    parts = _parts(image, m.name, "member")
    if not parts:
        return
    if m.ischr() or m.isblk():
        raise DeviceNode(image, f"layer member {m.name!r} is a device node ({'character' if m.ischr() else 'block'})")
    parent = _parent(image, root, parts, m.name)
    base = parts[-1]
    if base == OPAQUE:
        for child in list(parent.iterdir()):
            if child not in this_layer:
                _remove(child)
        return
    if base.startswith(WHITEOUT):
        hidden = base[len(WHITEOUT):]
        if hidden in ("", ".", ".."):
            raise PathEscape(image, f"layer whiteout {m.name!r} names no entry of its directory")
        _remove(parent / hidden)
        return
    dest = parent / base
    this_layer.add(dest)
    if m.isdir():
        if os.path.lexists(dest) and not (dest.is_dir() and not dest.is_symlink()):
            os.unlink(dest)
        dest.mkdir(mode=0o755, exist_ok=True)
        dir_modes[dest] = m.mode & KEEP_BITS
        return
    _remove(dest)
    if m.issym():
        os.symlink(m.linkname, dest)
    elif m.islnk():
        target_parts = _parts(image, m.linkname, "hard link target")
        target = _parent(image, root, target_parts, m.linkname) / target_parts[-1] if target_parts else root
        if not os.path.isfile(target) or os.path.islink(target):
            raise ImageError(image, f"layer member {m.name!r} hard-links {m.linkname!r}, which is not a file unpacked before it")
        os.link(target, dest, follow_symlinks=False)
    elif m.isfile():
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as out, tar.extractfile(m) as src:
            shutil.copyfileobj(src, out, 1 << 20)
            os.fchmod(out.fileno(), m.mode & KEEP_BITS & ~0o1000)
    elif m.isfifo():
        os.mkfifo(dest, m.mode & 0o777)
    else:
        raise ImageError(image, f"layer member {m.name!r} has an unsupported type {m.type!r}")


def finish(dir_modes: dict[Path, int]) -> None:
    """Set directory modes, deepest first (a read-only directory made early would block its children)."""
    for d in sorted(dir_modes, key=lambda p: len(p.parts), reverse=True):
        if os.path.isdir(d) and not os.path.islink(d):
            os.chmod(d, dir_modes[d])
