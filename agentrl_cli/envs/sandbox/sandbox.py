"""One sandbox: a bubblewrap process running the supervisor, a work directory, cgroups, limits.

A `Sandbox` is started once and runs many commands (`exec`); it is reset by destroying it and
starting a new one, never by cleaning in place. Closing it kills everything inside (the pid
namespace dies with its first process; the cgroups are emptied as well), unmounts and removes its
work directory. Fail closed: with `backend="bwrap"` and no working bubblewrap, construction raises
`SandboxUnavailable` with the fix. `backend="process"` runs the same supervisor WITHOUT isolation,
for hosts where that is an explicit, reported choice. With an image (`SandboxSettings.with_image`)
the image's root is the sandbox's read-only / (`bwrap.image_binds`); the supervisor then must be
the statically linked compiled one, or the image's own Python running supervisor.py from source.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import itertools
import json
import logging
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from agentrl_cli.envs.images import DEFAULT_CACHE_DIR, ImageError
from agentrl_cli.envs.images import resolve as resolve_image
from agentrl_cli.envs.sandbox import files
from agentrl_cli.envs.sandbox.bwrap import SANDBOX_ENV, SANDBOX_UID, WORK, BwrapProfile, SandboxUnavailable, check_bwrap
from agentrl_cli.envs.sandbox.cgroups import CgroupSet
from agentrl_cli.envs.sandbox.limits import MB, Limits, apply_rlimits, prlimit_args
from agentrl_cli.envs.sandbox.network import NET_DIR, SCRIPT_PATH, HostRelay, hosts_file, parse_allowlist
from agentrl_cli.envs.sandbox.result import ExecResult
from agentrl_cli.envs.sandbox.seccomp import bpf_program, program_fd
from agentrl_cli.envs.sandbox.supervisors import Supervisor, image_supervisor, support_dir

if TYPE_CHECKING:
    from agentrl_cli.config.models import HarnessConfig, SandboxConfig

log = logging.getLogger("agentrl.sandbox")
START_TIMEOUT_S = 30.0
HOST_GRACE_S = 5.0  # the host waits this much past a command's deadline before destroying the sandbox
_counter = itertools.count()
_libc = ctypes.CDLL(None, use_errno=True)
MNT_DETACH = 2


@dataclass(frozen=True)
class SandboxSettings:
    backend: str = "bwrap"  # "bwrap" | "process" (no isolation)
    bwrap: str = "bwrap"
    limits: Limits = field(default_factory=Limits)
    seccomp: bool = True
    cgroups: bool = True
    workdir_size_mb: int = 64
    root_dir: Path = Path(tempfile.gettempdir()) / "agentrl-sandboxes"
    python: str = "/usr/bin/python3"
    allowlist: tuple[str, ...] = ()  # host:port endpoints reachable from inside (see network.py); empty = none
    supervisor: str = "auto"  # "auto": the compiled one where a C compiler is, else "python" (supervisors.py)
    image: str = ""  # the image reference sandboxes run in ("" = the host's system, read-only)
    image_root: Path | None = None  # its unpacked root (set with `image` by `with_image`)
    image_digest: str = ""
    image_cache_dir: Path = Path(DEFAULT_CACHE_DIR)

    @classmethod
    def from_config(cls, c: SandboxConfig) -> "SandboxSettings":
        return cls(backend=c.backend, bwrap=c.bwrap, limits=Limits.from_config(c), seccomp=c.seccomp,
                   workdir_size_mb=c.workdir_size_mb, root_dir=Path(c.root_dir).expanduser(), python=c.python,
                   image_cache_dir=Path(c.image_cache_dir).expanduser())

    def for_harness(self, harness_config: HarnessConfig) -> "SandboxSettings":
        """These settings with the harness's egress policy (its allowlist when `network: allowlist`)
        and its image (`image`, resolved now: ImageError when it cannot be found, verified or unpacked)."""
        allow = tuple(harness_config.allowlist) if harness_config.network == "allowlist" else ()
        return replace(self, allowlist=allow).with_image(harness_config.image, harness_config.image_digest)

    def with_image(self, image: str, expect_digest: str = "") -> "SandboxSettings":
        """These settings rooted in `image` (unpacked into the cache once per digest); "" = the host's
        system. `expect_digest` (harnesses[].image_digest): the digest it must have, else ImageError."""
        if not image:
            return replace(self, image="", image_root=None, image_digest="")
        rootfs = resolve_image(image, self.image_cache_dir)
        if expect_digest and rootfs.digest != expect_digest:
            raise ImageError(image, f"its digest is {rootfs.digest}, not the pinned {expect_digest} (harnesses[].image_digest)",
                             "copy the pinned image here, or set image_digest to the image's digest if it changed on purpose")
        return replace(self, image=image, image_root=rootfs.path, image_digest=rootfs.digest)

    @property
    def privileged(self) -> bool:
        return os.geteuid() == 0


def umount_detach(target: Path) -> None:
    _libc.umount2(str(target).encode(), MNT_DETACH)


def _open_sandbox_work(outer_pid: int) -> int:
    """A directory fd of the sandbox's own /work tmpfs, opened through the root of the first process
    inside (bubblewrap's child) before any command has run. The fd pins that mount: the host reads
    and writes the work directory through it for the sandbox's whole life, whatever happens to the
    processes, and no mount of it ever exists in the host's namespace (a mount there would be copied
    into, and parsed by, every sandbox started after it)."""
    try:
        inner = int(Path(f"/proc/{outer_pid}/task/{outer_pid}/children").read_text().split()[0])
        return os.open(f"/proc/{inner}/root{WORK}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except (OSError, IndexError, ValueError) as exc:
        raise SandboxUnavailable(f"cannot open the sandbox's work directory from the host: {exc}",
                                 "run as root with /proc mounted, or set sandbox.backend: process") from None


@contextlib.contextmanager
def _as_fsuid(uid: int | None):
    """Create files as `uid` in this thread only (Linux keeps the filesystem uid per thread): a tmpfs
    mounted in the sandbox's user namespace takes no inode owned by a user it does not map."""
    if uid is None:
        yield
        return
    old_gid, old_uid = _libc.setfsgid(uid), _libc.setfsuid(uid)
    try:
        yield
    finally:
        _libc.setfsuid(old_uid)
        _libc.setfsgid(old_gid)


# Joins the cgroups named before `--` (writing 0 moves the shell itself), then execs the rest.
JOIN_CGROUPS = 'while [ "$1" != -- ]; do echo 0 > "$1" || exit 126; shift; done; shift; exec "$@"'


@functools.cache
def _launcher_programs() -> tuple[str | None, str | None, str | None]:
    return ("/bin/sh" if os.path.exists("/bin/sh") else None), shutil.which("prlimit"), shutil.which("setpriv")


def _launcher(cgroup: CgroupSet | None, rlimits: dict, as_uid: int | None) -> list[str] | None:
    """The programs that prepare the sandbox's first process and exec bubblewrap: `sh` joins the
    cgroups, util-linux `prlimit` sets the rlimits, `setpriv` drops to the sandbox user. Small
    programs exec'd in turn let the host start the sandbox with vfork; a Python `preexec_fn` forces a
    full fork of the host process, which for a trainer holding gigabytes costs tens of milliseconds
    of page-table copying per sandbox. None when these programs are missing (then `_preexec`)."""
    sh, prlimit, setpriv = _launcher_programs()
    if not (sh and prlimit and (setpriv or as_uid is None)):
        return None
    argv = [sh, "-c", JOIN_CGROUPS, "sh", *(str(d / "cgroup.procs") for d in (cgroup.dirs.values() if cgroup else ())), "--",
            prlimit, *prlimit_args(rlimits), "--"]
    if as_uid is not None:
        argv += [setpriv, f"--reuid={as_uid}", f"--regid={as_uid}", "--clear-groups", "--"]
    return argv


def _preexec(cgroup: CgroupSet | None, rlimits: dict, as_uid: int | None):
    """The same preparation in the forked child, for hosts without util-linux."""
    def preexec() -> None:  # runs in the child between fork and exec: plain syscalls only
        if cgroup is not None:
            cgroup.join_self()
        apply_rlimits(rlimits)
        if as_uid is not None:
            os.setgroups([])
            os.setresgid(as_uid, as_uid, as_uid)
            os.setresuid(as_uid, as_uid, as_uid)
    return preexec


class Sandbox:
    """A started sandbox. Use as a context manager or call `close()`."""

    def __init__(self, settings: SandboxSettings | None = None, name: str | None = None) -> None:
        self.settings = s = settings or SandboxSettings()
        self.id = name or f"{os.getpid()}-{next(_counter)}-{os.urandom(3).hex()}"
        self.isolated = s.backend == "bwrap"
        self._lock = threading.Lock()
        self._closed = False
        self._buf = b""
        self.cgroup: CgroupSet | None = None
        self.workdir_mounted = False  # never a host mount now (`orphans.py` still removes those earlier versions left)
        self.workdir_fd: int | None = None  # /work when it is a tmpfs of the sandbox's own, opened once at start
        self.relay: HostRelay | None = None
        try:
            endpoints = parse_allowlist(s.allowlist) if self.isolated else []
        except ValueError as exc:
            raise SandboxUnavailable(str(exc), "fix harnesses[].allowlist: host:port entries") from None
        bwrap = check_bwrap(s.bwrap) if self.isolated else None
        self.base = s.root_dir / self.id
        self.workdir = self.base / "work"
        support = support_dir(s.root_dir, SANDBOX_UID, WORK)
        python = s.python if (self.isolated or Path(s.python).exists()) else sys.executable
        self.supervisor = Supervisor.choose(support, python, s.supervisor)
        if s.image_root is not None:
            if not self.isolated:
                raise SandboxUnavailable(f"image {s.image!r}: the process backend cannot root a sandbox in an image",
                                         "set sandbox.backend: bwrap, or remove the image")
            self.supervisor = image_supervisor(self.supervisor, support, s.image, s.image_root, s.python)
        try:
            self.base.mkdir(mode=0o711, parents=True)
            self.workdir.mkdir(mode=0o700)
            as_uid = SANDBOX_UID if (s.privileged and self.isolated) else None
            if s.cgroups:
                self.cgroup = CgroupSet.create(f"{self.id}", s.limits.max_processes, s.limits.memory_mb * MB, s.limits.cpu_cores)
            seccomp_fd = program_fd() if (self.isolated and s.seccomp) else None
            if self.isolated:
                profile = BwrapProfile(bwrap=bwrap, workdir=self.workdir, support_dir=support, supervisor=self.supervisor.file,
                                       tmpfs_bytes=s.limits.tmpfs_size_mb * MB, python=s.python, seccomp_fd=seccomp_fd,
                                       workdir_bytes=s.workdir_size_mb * MB if as_uid is not None else None,
                                       image_root=s.image_root)
                command = self.supervisor.command(profile.supervisor_path, s.python)
                if endpoints:
                    command = self._egress(endpoints, profile, support, command)
                argv = profile.argv(command)
            else:
                argv = self.supervisor.command(str(support / self.supervisor.file), python)
            self.seccomp_loaded = seccomp_fd is not None
            self._log = open(self.base / "sandbox.log", "wb")
            rlimits = s.limits.sandbox_rlimits(cgroup_pids=self.cgroup is not None)
            env = dict(SANDBOX_ENV) if self.isolated else {**SANDBOX_ENV, "HOME": str(self.workdir)}
            launcher = _launcher(self.cgroup, rlimits, as_uid)
            self.launch = "vfork, then sh, prlimit, setpriv" if launcher else "fork with a preexec function"
            self.proc = subprocess.Popen([*launcher, *argv] if launcher else argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=self._log, pass_fds=(seccomp_fd,) if seccomp_fd is not None else (),
                                         preexec_fn=None if launcher else _preexec(self.cgroup, rlimits, as_uid),
                                         start_new_session=True, env=env, cwd=self.workdir if not self.isolated else "/")
            if seccomp_fd is not None:
                os.close(seccomp_fd)
            os.set_blocking(self.proc.stdout.fileno(), False)
            ready = self._read_response(time.monotonic() + START_TIMEOUT_S)
            if not ready or not ready.get("ready"):
                raise SandboxUnavailable(f"sandbox {self.id} did not start: {self._log_tail() or 'no output'}",
                                         "run `agentrl sandbox run -- true` to see the failure; check bubblewrap and /usr/bin/python3")
            if self.isolated and as_uid is not None:
                self.workdir_fd = _open_sandbox_work(self.proc.pid)
        except BaseException:
            self.close()
            raise

    def _egress(self, endpoints, profile: BwrapProfile, support: Path, command: list[str]) -> list[str]:
        """Start the host relays for the allow-listed endpoints and wrap `command` in the in-sandbox forwarder."""
        image = self.settings.image_root
        if image is not None and not os.path.lexists(image / self.settings.python.lstrip("/")):
            raise SandboxUnavailable(f"image {self.settings.image!r}: its egress allowlist needs {self.settings.python} "
                                     "inside the image, which has none", "use an image with Python, or network: egress_deny_by_default")
        self.relay = HostRelay(endpoints, self.base / "net")
        profile.extra_ro_binds += [(str(self.base / "net"), NET_DIR), (str(support / "network.py"), SCRIPT_PATH)]
        hosts = hosts_file(endpoints)
        if hosts is not None:
            (self.base / "hosts").write_text(hosts)
            os.chmod(self.base / "hosts", 0o644)
            profile.extra_ro_binds.append((str(self.base / "hosts"), "/etc/hosts"))
        return [self.settings.python, "-I", "-S", SCRIPT_PATH, *self.relay.forwarder_args(), "--", *command]

    # -- commands ---------------------------------------------------------------------------------
    def exec(self, command: str | list[str], timeout: float | None = None, stdin: str | None = None,
             env: dict | None = None, cwd: str | None = None, cpu_time_s: int | None = None) -> ExecResult:
        """Run one command (a string goes to bash -c) and wait for it, within the limits."""
        argv = ["/bin/bash", "-c", command] if isinstance(command, str) else list(command)
        lim = self.settings.limits
        timeout = lim.wall_timeout_s if timeout is None else timeout
        req = {"op": "exec", "argv": argv, "timeout": timeout, "stdin": stdin or "",
               "output_limit": lim.output_limit_bytes, "cpu_time": cpu_time_s or lim.cpu_time_s,
               "env": {**SANDBOX_ENV, **({"HOME": str(self.workdir)} if not self.isolated else {}), **(env or {})},
               "cwd": cwd or (WORK if self.isolated else str(self.workdir)),
               "address_space": None if self.cgroup else lim.memory_mb * MB}
        with self._lock:
            if self._closed or self.proc.poll() is not None:
                return ExecResult(exit_code=None, killed_reason="sandbox_lost", error="the sandbox is not running")
            oom_before = self.cgroup.oom_kills() if self.cgroup else 0
            fail_before = self._pids_max_events()
            t0 = time.monotonic()
            resp = self._request(req, t0 + timeout + HOST_GRACE_S)
            if resp is None:  # the supervisor stopped answering: destroy everything
                self._kill()
                return ExecResult(exit_code=None, timed_out=True, killed_reason="wall_timeout",
                                  duration_s=time.monotonic() - t0, error="sandbox stopped answering; destroyed")
            result = ExecResult.from_supervisor(resp)
            if self.cgroup and self.cgroup.oom_kills() > oom_before:
                result.killed_reason = "memory"
                result.limits_hit["memory_mb"] = lim.memory_mb
            hits = self._pids_max_events() - fail_before
            if hits:
                result.limits_hit["processes"] = hits
            return result

    def ping(self) -> bool:
        with self._lock:
            return not self._closed and self._request({"op": "ping"}, time.monotonic() + 5) is not None

    def _pids_max_events(self) -> int:
        if not self.cgroup:
            return 0
        d = self.cgroup.dirs.get("pids") or self.cgroup.dirs.get("unified")
        try:
            for line in (d / "pids.events").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "max":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def _request(self, req: dict, deadline: float) -> dict | None:
        try:
            self.proc.stdin.write(self.supervisor.frame({**req, "id": next(_counter)}))
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return None
        return self._read_response(deadline)

    def _read_response(self, deadline: float) -> dict | None:
        """The supervisor's next answer; None when it breaks the protocol, stops or misses the deadline."""
        while b"\n" not in self._buf:
            if not self._fill(deadline):
                return None
        line, _, self._buf = self._buf.partition(b"\n")
        try:
            resp = json.loads(line)
        except ValueError:
            return None
        if not isinstance(resp, dict):
            return None
        if "stdout_bytes" in resp:  # the compiled supervisor: raw output follows the line
            n, m = resp.pop("stdout_bytes"), resp.pop("stderr_bytes", None)
            if not (isinstance(n, int) and isinstance(m, int) and 0 <= n and 0 <= m
                    and n + m <= self.settings.limits.output_limit_bytes):
                return None
            while len(self._buf) < n + m:
                if not self._fill(deadline):
                    return None
            data, self._buf = self._buf[:n + m], self._buf[n + m:]
            resp["stdout"], resp["stderr"] = data[:n].decode("utf-8", "replace"), data[n:].decode("utf-8", "replace")
        return resp

    def _fill(self, deadline: float) -> bool:
        """Read what the supervisor has written into the buffer; False at its end or past the deadline."""
        fd = self.proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(min(left, 1.0)) and self.proc.poll() is not None:
                    return False
                try:
                    chunk = os.read(fd, 1 << 20)
                except BlockingIOError:
                    continue
                if not chunk:
                    return False
                self._buf += chunk
                return True

    # -- files --------------------------------------------------------------------------------------
    def read_file(self, relpath: str, max_bytes: int = 1 << 20) -> bytes:
        return files.read_file(self.workdir if self.workdir_fd is None else self.workdir_fd, relpath, max_bytes)

    def write_file(self, relpath: str, data: bytes | str, mode: int = 0o644) -> None:
        uid = SANDBOX_UID if (self.isolated and self.settings.privileged) else None
        data = data.encode() if isinstance(data, str) else data
        if self.workdir_fd is None:
            files.write_file(self.workdir, relpath, data, uid=uid, mode=mode)
            return
        with _as_fsuid(uid):  # created by the sandbox user, as the files its commands make
            files.write_file(self.workdir_fd, relpath, data, mode=mode)

    # -- lifecycle ----------------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return not self._closed and getattr(self, "proc", None) is not None and self.proc.poll() is None

    def resources(self) -> dict | None:
        """What the sandbox used so far, from its cgroups and /proc (`CgroupSet.usage`: cpu_s,
        peak_memory_bytes, processes, open_files); read it before `close()`, which removes the
        groups. None without cgroups (rlimits account nothing per sandbox)."""
        if self.cgroup is None or self._closed:
            return None
        return self.cgroup.usage()

    def processes(self) -> set[int]:
        """Host pids of everything still running in this sandbox (from its cgroups)."""
        return self.cgroup.pids() if self.cgroup else set()

    def _kill(self) -> None:
        """Kill everything inside first, so the outer bubblewrap reaps its child and exits by itself
        (killing it first would orphan the inner one to the host's init as a zombie)."""
        proc = getattr(self, "proc", None)
        if self.cgroup and proc is not None:
            outer = proc.pid
            for _ in range(100):
                inner = self.cgroup.pids() - {outer}
                if not inner:
                    break
                for pid in inner:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                time.sleep(0.002)
            try:
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
        if self.cgroup:
            self.cgroup.kill_all()
        if proc is not None:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                log.error("sandbox %s: process %s did not exit after SIGKILL", self.id, proc.pid)

    def close(self) -> None:
        """Kill everything inside, remove the cgroups, unmount and delete the work directory."""
        if self._closed:
            return
        self._closed = True
        self._kill()
        proc = getattr(self, "proc", None)
        if proc is not None:
            for stream in (proc.stdin, proc.stdout):
                try:
                    stream.close()
                except OSError:
                    pass
        if getattr(self, "_log", None) is not None:
            self._log.close()
        if self.cgroup:
            self.cgroup.destroy()
        if self.relay is not None:
            self.relay.close()
        if self.workdir_fd is not None:
            os.close(self.workdir_fd)
            self.workdir_fd = None
        shutil.rmtree(self.base, ignore_errors=True)

    def _log_tail(self, n: int = 2000) -> str:
        try:
            return (self.base / "sandbox.log").read_bytes()[-n:].decode("utf-8", "replace").strip()
        except OSError:
            return ""

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def describe(self) -> dict:
        return {"id": self.id, "backend": self.settings.backend, "isolated": self.isolated,
                "seccomp": "loaded" if self.seccomp_loaded else bpf_program()[1] if self.isolated else "not used",
                "cgroups": f"v{self.cgroup.version}" if self.cgroup else "none (rlimits)",
                "workdir": "tmpfs" if self.workdir_fd is not None else "directory", "launch": self.launch,
                "supervisor": self.supervisor.kind,
                "image": {"ref": self.settings.image, "digest": self.settings.image_digest} if self.settings.image else "host",
                "egress": [f"{e.host}:{e.port}" for e in self.relay.endpoints] if self.relay else "none"}
