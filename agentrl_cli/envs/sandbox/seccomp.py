"""The sandbox's seccomp filter: a precompiled BPF program that bubblewrap loads (`--seccomp FD`).

Denied with EPERM: ptrace, mount/umount, pivot_root, chroot, unshare, setns, keyctl, add_key,
request_key, perf_event_open, bpf, io_uring_*, and ioctl(TIOCSTI); clone3 gets ENOSYS so libc
falls back to clone. Built with libseccomp through `pyseccomp` when both are present; otherwise
`bpf_program()` returns None and the sandbox reports the filter as not loaded.
"""

from __future__ import annotations

import errno
import os
import tempfile
import termios
from functools import lru_cache

DENY_EPERM = ("ptrace", "mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "keyctl", "add_key",
              "request_key", "perf_event_open", "bpf", "io_uring_setup", "io_uring_enter", "io_uring_register",
              "process_vm_readv", "process_vm_writev", "kexec_load", "init_module", "finit_module", "delete_module")


@lru_cache(maxsize=1)
def bpf_program() -> tuple[bytes | None, str]:
    """(BPF bytes, status line). Bytes are None when the filter cannot be built here."""
    try:
        import pyseccomp as sc
    except Exception as exc:  # noqa: BLE001 - ImportError or a missing libseccomp.so
        return None, f"not loaded: pyseccomp/libseccomp unavailable ({exc.__class__.__name__})"
    try:
        f = sc.SyscallFilter(sc.ALLOW)
        for name in DENY_EPERM:
            try:
                f.add_rule(sc.ERRNO(errno.EPERM), name)
            except (RuntimeError, ValueError, OSError):
                continue  # syscall unknown on this architecture
        f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
        f.add_rule(sc.ERRNO(errno.EPERM), "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, termios.TIOCSTI))
        with tempfile.TemporaryFile() as tmp:
            f.export_bpf(tmp)
            tmp.seek(0)
            return tmp.read(), "loaded"
    except Exception as exc:  # noqa: BLE001
        return None, f"not loaded: building the filter failed ({exc})"


def program_fd() -> int | None:
    """A fresh fd holding the BPF program at offset 0 (bubblewrap reads it to the end), or None."""
    program, _ = bpf_program()
    if program is None:
        return None
    fd = os.memfd_create("agentrl-seccomp", 0)
    os.write(fd, program)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
