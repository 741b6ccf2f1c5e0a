"""docs/security.md rows 1-13: the attacks and faults a sandbox must survive, against real bubblewrap.

Isolation is proved with a listener this test starts on the host's loopback; no traffic goes
anywhere else.
"""

from __future__ import annotations

import os
import platform
import resource
import shutil
import socket
import stat
import tempfile
import threading
from pathlib import Path

import pytest

from agentrl_cli.envs.sandbox import Sandbox, SandboxSettings, SandboxUnavailable
from agentrl_cli.envs.sandbox.files import UnsafePath
from tests.integration.conftest import needs_bwrap

pytestmark = [pytest.mark.integration, needs_bwrap]
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="cgroup limits and the tmpfs work dir need root here")


def _gone(pids: set[int]) -> bool:
    return not any(Path(f"/proc/{p}").exists() for p in pids)


@root_only
def test_1_fork_bomb_hits_process_limit_and_leaves_nothing(make_sandbox):
    sb = make_sandbox(max_processes=32, wall_timeout_s=3)
    r = sb.exec("bomb() { bomb | bomb & }; bomb; sleep 5")
    assert r.status in ("timeout", "error")
    assert r.limits_hit.get("processes", 0) > 0, "the process limit was never hit"
    assert sb.exec("echo alive", timeout=10).stdout.strip() == "alive"  # the sandbox (and host) still respond
    pids = sb.processes()
    sb.close()
    assert _wait_gone(pids)


@root_only
def test_2_memory_bomb_is_killed_inside_its_limit(make_sandbox):
    sb = make_sandbox(memory_mb=128, wall_timeout_s=20)
    r = sb.exec(["python3", "-c", "x = []\nwhile True: x.append(bytearray(16 << 20))"])
    assert r.killed_reason == "memory" and r.status == "error"
    assert r.limits_hit["memory_mb"] == 128
    assert r.max_rss_kb < 200 * 1024


def test_3_cpu_spin_is_stopped_by_the_cpu_limit(make_sandbox):
    r = make_sandbox(cpu_time_s=1, wall_timeout_s=20).exec("while :; do :; done")
    assert r.status == "timeout" and r.killed_reason == "cpu_time"


def test_3_sleep_forever_is_stopped_by_the_wall_clock(make_sandbox):
    r = make_sandbox().exec("sleep 1e6", timeout=1)
    assert r.status == "timeout" and r.killed_reason == "wall_timeout" and r.duration_s < 10


@root_only
def test_4_daemon_dies_with_the_episode(make_sandbox):
    sb = make_sandbox()
    assert sb.exec("nohup sleep 1000 >/dev/null 2>&1 & setsid sleep 1001 >/dev/null 2>&1 & sleep 0.3; echo started").stdout.strip() == "started"
    pids = sb.processes()
    assert len(pids) >= 4  # bwrap init, supervisor and the two daemons
    sb.close()
    assert _wait_gone(pids), "a descendant survived the sandbox"


@root_only
def test_4_daemon_dies_when_the_sandbox_parent_is_sigkilled(make_sandbox):
    sb = make_sandbox()
    sb.exec("nohup sleep 1000 >/dev/null 2>&1 &")
    pids = sb.processes()
    os.kill(sb.proc.pid, 9)
    sb.proc.wait(timeout=10)
    # --die-with-parent and the pid namespace take everything down without our help
    # (the inner bubblewrap is reaped by the host's init, hence the wait)
    assert _wait_gone(pids - {sb.proc.pid}, seconds=10)
    sb.close()


def _wait_gone(pids: set[int], seconds: float = 5.0) -> bool:
    import time
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if _gone(pids):
            return True
        time.sleep(0.05)
    return False


def test_5_host_files_and_environment_are_invisible(make_sandbox, tmp_path, monkeypatch):
    secret = tmp_path / "host-secret.txt"
    secret.write_text("TOP-SECRET-VALUE")
    monkeypatch.setenv("AGENTRL_HOST_SECRET", "TOP-SECRET-ENV")
    sb = make_sandbox()
    r = sb.exec(f"cat {secret}; ls /root /home; env; cat /proc/1/environ; cat /proc/self/environ")
    assert "TOP-SECRET" not in r.stdout + r.stderr
    assert "No such file or directory" in r.stderr
    env_lines = sb.exec("env").stdout.split()
    assert {line.split("=")[0] for line in env_lines} <= {"PATH", "HOME", "LANG", "TMPDIR", "PYTHONDONTWRITEBYTECODE", "PWD", "SHLVL", "_"}


def test_6_everything_outside_the_work_dir_is_read_only(make_sandbox):
    sb = make_sandbox()
    for target in ("/usr/agentrl-x", "/etc/agentrl-x", "/agentrl-x", "/bin/agentrl-x"):
        r = sb.exec(f"echo x > {target}")
        assert r.exit_code != 0 and ("Read-only file system" in r.stderr or "Permission denied" in r.stderr), target
        assert not Path(target).exists()
    assert sb.exec("echo ok > /work/f && echo ok > /tmp/f && cat /work/f /tmp/f").stdout == "ok\nok\n"


def test_7_collector_never_follows_links_out_of_the_sandbox(make_sandbox):
    sb = make_sandbox()
    sb.exec("ln -s /etc/passwd sym.txt; ln -s / rootlink; echo data > real.txt; ln real.txt hard.txt; "
                "ln /usr/bin/python3 hostlink 2>&1; mkdir d; echo inner > d/f")
    assert "hostlink" not in sb.exec("ls").stdout.split(), "a hard link to a host file was created"
    for path in ("sym.txt", "rootlink/etc/passwd", "hard.txt", "../work/real.txt", "/etc/passwd", "d/../real.txt"):
        with pytest.raises(UnsafePath):
            sb.read_file(path)
    assert sb.read_file("d/f") == b"inner\n"


def test_8_proc_shows_only_the_sandbox_processes(make_sandbox):
    sb = make_sandbox()
    numeric = [p for p in sb.exec("ls /proc").stdout.split() if p.isdigit()]
    assert 1 <= len(numeric) <= 6
    assert str(os.getpid()) not in numeric or os.getpid() < 10
    r = sb.exec("cat /proc/1/environ | tr '\\0' '\\n'")
    assert "AGENTRL" not in r.stdout


def test_8_commands_cannot_open_the_supervisors_pipes(make_sandbox):
    """The supervisor (the parent of every command, same uid) is not dumpable: a command cannot open
    its request or answer pipe through /proc to forge requests or answers."""
    sb = make_sandbox()
    r = sb.exec('tr "\\0" " " < /proc/$PPID/cmdline; echo; echo forged > /proc/$PPID/fd/1; echo "write=$?"; '
                'ls /proc/$PPID/fd; echo "list=$?"')
    assert "/.agentrl/supervisor" in r.stdout, r.stdout  # $PPID is the supervisor
    assert "write=1" in r.stdout and "list=2" in r.stdout and "Permission denied" in r.stderr, (r.stdout, r.stderr)
    assert sb.exec("echo still answering").stdout == "still answering\n"


def test_9_network_is_its_own_and_empty(make_sandbox):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    accepted = []
    listener.settimeout(3)
    t = threading.Thread(target=lambda: _accept(listener, accepted), daemon=True)
    t.start()
    try:
        sb = make_sandbox()
        code = f"""
import socket
s = socket.socket(); s.settimeout(2)
try:
    s.connect(("127.0.0.1", {port})); print("CONNECTED")
except OSError as e:
    print("refused", e.errno)
try:
    socket.getaddrinfo("localhost-does-not-resolve.invalid", 80); print("RESOLVED")
except OSError as e:
    print("dns failed")
try:
    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP); print("RAW OK")
except OSError as e:
    print("raw denied", e.errno)
print(sorted(n for _, n in socket.if_nameindex()))
"""
        out = sb.exec(["python3", "-c", code]).stdout
        assert "CONNECTED" not in out and "refused" in out
        assert "RESOLVED" not in out and "RAW OK" not in out
        assert "['lo']" in out
        t.join(timeout=5)
        assert accepted == [], "the host listener was reached from inside the sandbox"
    finally:
        listener.close()


def _accept(listener: socket.socket, accepted: list) -> None:
    try:
        conn, _ = listener.accept()
        accepted.append(conn)
    except OSError:
        pass


SYSCALLS_X86_64 = {"ptrace": 101, "mount": 165, "unshare": 272, "keyctl": 250, "perf_event_open": 298,
                   "io_uring_setup": 425, "setns": 308, "chroot": 161, "bpf": 321}


@pytest.mark.skipif(platform.machine() != "x86_64", reason="syscall numbers below are x86_64")
def test_10_dangerous_syscalls_are_refused(make_sandbox):
    sb = make_sandbox()
    assert sb.seccomp_loaded, "the seccomp filter did not load; install pyseccomp and libseccomp2"
    code = f"""
import ctypes, json
libc = ctypes.CDLL(None, use_errno=True)
out = {{}}
for name, nr in {SYSCALLS_X86_64!r}.items():
    rc = libc.syscall(nr, 0, 0, 0, 0, 0)
    out[name] = (rc, ctypes.get_errno())
out["clone3"] = (libc.syscall(435, 0, 0), ctypes.get_errno())
print(json.dumps(out))
"""
    import json
    result = json.loads(sb.exec(["python3", "-c", code]).stdout)
    for name, (rc, err) in result.items():
        assert rc == -1, name
        assert err == (38 if name == "clone3" else 1), (name, err)  # ENOSYS / EPERM
    assert "Seccomp:\t2" in sb.exec("grep Seccomp: /proc/self/status").stdout


def test_11_flood_of_output_is_capped_and_flagged(make_sandbox):
    sb = make_sandbox(output_limit_bytes=256 * 1024, wall_timeout_s=60)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    r = sb.exec("head -c 10G /dev/zero | tr '\\0' 'y'")
    assert r.truncated and r.killed_reason == "output_limit"
    assert len(r.stdout) + len(r.stderr) <= 256 * 1024
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100 * 1024


@root_only
def test_12_filling_the_disk_hits_enospc_inside_the_limit(sandbox_root):
    settings = SandboxSettings(root_dir=sandbox_root, workdir_size_mb=16)
    settings = SandboxSettings(root_dir=sandbox_root, workdir_size_mb=16, limits=settings.limits.with_(max_file_size_mb=1024, tmpfs_size_mb=16))
    host_before = os.statvfs("/").f_bfree
    with Sandbox(settings) as sb:
        r = sb.exec("dd if=/dev/zero of=/work/big bs=1M count=200 2>&1; dd if=/dev/zero of=/tmp/big bs=1M count=200 2>&1")
        assert r.stdout.count("No space left on device") == 2, r.stdout
    host_after = os.statvfs("/").f_bfree
    assert (host_before - host_after) * os.statvfs("/").f_frsize < 50 * 1024 * 1024


def test_13_missing_bubblewrap_refuses_with_the_fix(sandbox_root):
    with pytest.raises(SandboxUnavailable) as info:
        Sandbox(SandboxSettings(bwrap="/nonexistent/bwrap", root_dir=sandbox_root))
    assert "apt-get install bubblewrap" in info.value.hint


def test_13_refused_namespaces_refuse_with_the_fix(sandbox_root):
    fake_dir = Path(tempfile.mkdtemp(prefix="fake-bwrap-"))  # reachable by the sandbox user
    os.chmod(fake_dir, 0o755)
    fake = fake_dir / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to creating new namespace' >&2\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC | stat.S_IXOTH | stat.S_IXGRP)
    with pytest.raises(SandboxUnavailable) as info:
        Sandbox(SandboxSettings(bwrap=str(fake), root_dir=sandbox_root))
    shutil.rmtree(fake_dir)
    assert "No permissions to creating new namespace" in info.value.message and "user namespaces" in info.value.hint
