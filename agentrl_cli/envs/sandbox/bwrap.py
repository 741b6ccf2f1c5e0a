"""The bubblewrap command line of a sandbox, and the fail-closed check that bubblewrap works here.

Profile (docs/security.md): user, pid, ipc, net, uts and cgroup namespaces each asked for explicitly
(the `-try` variants fail silently); `--die-with-parent`; `--new-session` (TIOCSTI); a fresh /proc
after the pid namespace; bubblewrap's minimal /dev; the system read-only (/usr and the few /etc
files programs need, no host home, no host /tmp); one writable work directory; a size-limited
tmpfs for /tmp; an empty environment; a hostname of its own; all capabilities dropped; the root
remounted read-only; the seccomp filter when available. With an image (`image_root`, from
`envs/images`) the image's top-level entries replace the host's system directories and /etc files
(`image_binds`): nothing of the host is bound but agentrl's own support files.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from agentrl_cli.core.errors import AgentrlError

SANDBOX_UID = 65534
WORK = "/work"
SUPPORT_MOUNT = "/.agentrl"
INSTALL_FIX = "install bubblewrap (`apt-get install bubblewrap`), or set sandbox.backend: process to run WITHOUT isolation"
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "localtime", "nsswitch.conf", "mime.types")
SANDBOX_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": WORK, "LANG": "C.UTF-8", "TMPDIR": "/tmp",
               "PYTHONDONTWRITEBYTECODE": "1"}


class SandboxUnavailable(AgentrlError):
    """Isolation cannot be set up here: the sandbox refuses to run untrusted code."""


@dataclass
class BwrapProfile:
    bwrap: str
    workdir: Path  # host directory bound read-write at /work (unless workdir_bytes)
    support_dir: Path  # host directory with supervisor.py, passwd, group (bound read-only)
    tmpfs_bytes: int
    python: str = "/usr/bin/python3"
    seccomp_fd: int | None = None
    supervisor: str = "supervisor.py"  # the file of support_dir that runs as the supervisor (source or bytecode)
    workdir_bytes: int | None = None  # /work as a tmpfs of this size in the sandbox's own mount namespace
    hostname: str = "sandbox"
    extra_ro_binds: list[tuple[str, str]] = field(default_factory=list)
    image_root: Path | None = None  # an unpacked image's root: the sandbox's / instead of the host's system

    @property
    def supervisor_path(self) -> str:
        """Where the supervisor is inside the sandbox."""
        return f"{SUPPORT_MOUNT}/{Path(self.supervisor).name}"

    def argv(self, command: list[str]) -> list[str]:
        a = [self.bwrap,
             "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-net", "--unshare-uts", "--unshare-cgroup",
             "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--hostname", self.hostname,
             "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
        if self.image_root is not None:
            a += image_binds(self.image_root)
        else:
            a += system_binds()
            for name in ETC_FILES:
                if (Path("/etc") / name).exists():
                    a += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
        a += ["--ro-bind", str(self.support_dir / "passwd"), "/etc/passwd",
              "--ro-bind", str(self.support_dir / "group"), "/etc/group",
              "--ro-bind", str(self.support_dir / self.supervisor), self.supervisor_path]
        for src, dst in self.extra_ro_binds:
            a += ["--ro-bind", src, dst]
        a += ["--proc", "/proc", "--dev", "/dev",
              "--size", str(self.tmpfs_bytes), "--perms", "1777", "--tmpfs", "/tmp",
              *(("--size", str(self.workdir_bytes), "--perms", "0700", "--tmpfs", WORK) if self.workdir_bytes
                else ("--bind", str(self.workdir), WORK)), "--chdir", WORK,
              "--remount-ro", "/", "--clearenv"]
        for k, v in SANDBOX_ENV.items():
            a += ["--setenv", k, v]
        if self.seccomp_fd is not None:
            a += ["--seccomp", str(self.seccomp_fd)]
        return a + ["--", *command]


def system_binds() -> list[str]:
    """/usr read-only, and /bin, /lib* and /sbin as the host has them (symlinks into /usr or binds)."""
    a = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "lib", "lib32", "lib64", "libx32", "sbin"):
        host = Path("/") / name
        if host.is_symlink():
            a += ["--symlink", os.readlink(host), f"/{name}"]
        elif host.is_dir():
            a += ["--ro-bind", str(host), f"/{name}"]
    return a


IMAGE_SKIP = {"proc", "dev", "tmp", "etc", WORK.strip("/"), SUPPORT_MOUNT.strip("/")}
OWN_ETC = {"passwd", "group"}  # the sandbox user's, from the support directory


def _entry_binds(src: Path, dst: str, skip: set[str]) -> list[str]:
    a = []
    for entry in sorted(os.scandir(src), key=lambda e: e.name):
        if entry.name in skip:
            continue
        if entry.is_symlink():
            a += ["--symlink", os.readlink(entry.path), f"{dst}/{entry.name}"]
        elif entry.is_dir(follow_symlinks=False) or entry.is_file(follow_symlinks=False):
            a += ["--ro-bind", entry.path, f"{dst}/{entry.name}"]
    return a


def image_binds(root: Path) -> list[str]:
    """An image root's top-level entries read-only at / (symlinks as they are), and its /etc entry by
    entry so the sandbox's own passwd and group can sit beside them; /proc, /dev, /tmp and the work
    directory are the sandbox's own, as with the host root."""
    a = _entry_binds(root, "", IMAGE_SKIP) + ["--dir", "/etc"]
    etc = root / "etc"
    if etc.is_dir() and not etc.is_symlink():
        a += _entry_binds(etc, "/etc", OWN_ETC)
    return a


def find_bwrap(configured: str = "bwrap") -> str:
    path = shutil.which(configured)
    if path is None:
        raise SandboxUnavailable(f"bubblewrap ({configured}) not found: refusing to run untrusted code without isolation",
                                 INSTALL_FIX)
    return path


@lru_cache(maxsize=8)
def _probe(bwrap: str) -> str | None:
    """None when a minimal sandbox with every namespace starts, else bubblewrap's complaint."""
    cmd = [bwrap, "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-net", "--unshare-uts",
           "--unshare-cgroup", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--die-with-parent",
           *system_binds(), "--proc", "/proc", "--dev", "/dev", "--", "/usr/bin/true"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30,
                              user=SANDBOX_UID if os.geteuid() == 0 else None)
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    return None if proc.returncode == 0 else (proc.stderr.strip() or f"exit code {proc.returncode}")


def check_bwrap(configured: str = "bwrap") -> str:
    """Path of a bubblewrap that works here, or SandboxUnavailable naming the fix."""
    path = find_bwrap(configured)
    problem = _probe(path)
    if problem is not None:
        raise SandboxUnavailable(
            f"bubblewrap cannot create the sandbox namespaces here: {problem}",
            "allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1 or "
            "user.max_user_namespaces > 0; in a container, run it with a seccomp/AppArmor profile that permits "
            f"unshare), or {INSTALL_FIX.split(', or ')[1]}")
    return path
