"""Host-side access to a sandbox's work directory that never leaves it.

`root` is the work directory's path or an open directory fd of it. The agent controls everything
under the work directory, including symlinks and hard links that point at host files. Every path is
opened component by component relative to the work directory with O_NOFOLLOW, `..` and absolute
paths are refused, and a file with more than one link is refused, so the collector stays inside
the sandbox root.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath

from agentrl_cli.core.errors import AgentrlError


class UnsafePath(AgentrlError):
    """A path in a sandbox that would lead outside it (or is not a plain file)."""


def _parts(relpath: str) -> list[str]:
    p = PurePosixPath(relpath)
    if p.is_absolute() or not p.parts or any(part in ("..", "") for part in p.parts):
        raise UnsafePath(f"refusing path {relpath!r}", "use a relative path inside the sandbox work directory, without '..'")
    return [part for part in p.parts if part != "."]


def _open_parent(root: Path | int, parts: list[str], create: bool = False, uid: int | None = None) -> int:
    fd = os.dup(root) if isinstance(root, int) else os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            if create:
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                    if uid is not None:
                        os.chown(part, uid, uid, dir_fd=fd, follow_symlinks=False)
                except FileExistsError:
                    pass
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return fd
    except OSError as exc:
        os.close(fd)
        raise UnsafePath(f"cannot open {'/'.join(parts)!r} inside the sandbox without following links: {exc.strerror}",
                         "the path must be a real directory tree inside the work directory") from None


def read_file(root: Path | int, relpath: str, max_bytes: int = 1 << 20) -> bytes:
    """Read a regular, singly-linked file under `root` without following any link."""
    parts = _parts(relpath)
    dir_fd = _open_parent(root, parts)
    try:
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
        except OSError as exc:
            raise UnsafePath(f"cannot open {relpath!r} without following links: {exc.strerror}",
                             "the file must be a regular file inside the work directory") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise UnsafePath(f"{relpath!r} is not a regular file", "results must be plain files")
            if st.st_nlink != 1:
                raise UnsafePath(f"{relpath!r} has {st.st_nlink} hard links; refusing to read it",
                                 "results must be plain files created inside the sandbox")
            chunks, left = [], max_bytes
            while left > 0:
                chunk = os.read(fd, min(left, 65536))
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)
    finally:
        os.close(dir_fd)


def write_file(root: Path | int, relpath: str, data: bytes, uid: int | None = None, mode: int = 0o644) -> None:
    """Create (or replace) a file under `root` without following links; owned by `uid` if given."""
    parts = _parts(relpath)
    dir_fd = _open_parent(root, parts, create=True, uid=uid)
    try:
        try:
            os.unlink(parts[-1], dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        except IsADirectoryError:
            raise UnsafePath(f"{relpath!r} is a directory", "choose a file path") from None
        fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if uid is not None:
                os.fchown(fd, uid, uid)
        finally:
            os.close(fd)
    finally:
        os.close(dir_fd)
