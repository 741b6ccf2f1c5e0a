"""Real services for the control-plane tests: a single-node Slurm (munged, slurmctld, slurmd from Debian's
packages, no slurmdbd) and a PostgreSQL server (initdb + pg_ctl on a temp dir and a free loopback port).

Each starter returns None with the reason when the binaries (or root, which slurmd and munge need) are
missing, so fixtures skip saying why; CI installs them (.ci/setup --dev), so there they run. Daemons
are stopped by the PIDs recorded at start, newest first: TERM, then KILL after a grace period.

Slurm is machine-wide (/etc/slurm/slurm.conf, /run/munge, slurmctld's state directory): `start_slurm`
holds a lock file in the temp directory until `stop`, so two test processes (pytest-xdist workers, or
two checkouts' test runs on one machine) never start or reconfigure it under each other.
"""

from __future__ import annotations

import fcntl
import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

SLURM_BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo")


@dataclass
class Service:
    pids: list[int] = field(default_factory=list)
    dirs: list[str] = field(default_factory=list)
    info: dict = field(default_factory=dict)
    lock: object | None = None  # an open lock file held while the service runs (machine-wide services)

    def stop(self) -> None:
        for pid in reversed(self.pids):
            _terminate(pid)
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)
        if self.lock is not None:
            self.lock.close()  # releases the flock
            self.lock = None


SLURM_LOCK = Path(tempfile.gettempdir()) / "agentrl-tests-slurm.lock"


def _machine_lock(path: Path, deadline_s: float, what: str):
    """An exclusive flock on `path`, waiting at most `deadline_s` for whoever holds it."""
    f = open(path, "a")
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return f
        except BlockingIOError:
            if time.monotonic() > deadline:
                f.close()
                raise TimeoutError(f"timed out after {deadline_s:.0f} s waiting for {what} ({path}): another test "
                                   "process is using it") from None
            time.sleep(0.5)


def _terminate(pid: int, grace_s: float = 20.0) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                return
        except ChildProcessError:  # not our child: poll for it to go away
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


def slurm_missing() -> str:
    """'' when a single-node Slurm can be started here, else why not."""
    missing = [b for b in SLURM_BINARIES if not _which(b)]
    if missing:
        return (f"Slurm is not installed ({', '.join(missing)} missing): "
                "apt-get install slurmctld slurmd slurm-client munge (bash .ci/setup --dev does)")
    if os.geteuid() != 0:
        return "starting slurmd and munged needs root"
    return ""


def start_slurm(conf_text: str, deadline_s: float = 60.0) -> Service:
    """Write /etc/slurm/slurm.conf, start munged, slurmctld and slurmd; return once the node is idle.
    Holds SLURM_LOCK until `stop` (another process's Slurm tests wait for it, at most 300 s)."""
    svc = Service(lock=_machine_lock(SLURM_LOCK, 300.0, "the machine's Slurm"))
    try:
        key = Path("/etc/munge/munge.key")
        if not key.exists() or key.stat().st_size == 0:
            subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True)
        shutil.chown(key, "munge", "munge")
        key.chmod(0o400)
        for d, owner, mode in (("/run/munge", "munge", 0o755), ("/var/lib/munge", "munge", 0o700), ("/var/log/munge", "munge", 0o700),
                               ("/run/slurm", "slurm", 0o755), ("/var/log/slurm", "slurm", 0o755),
                               ("/var/lib/slurm/slurmctld", "slurm", 0o755), ("/var/lib/slurm/slurmd", "slurm", 0o755)):
            Path(d).mkdir(parents=True, exist_ok=True)
            shutil.chown(d, owner, owner)
            os.chmod(d, mode)
        for d in ("/var/lib/slurm/slurmctld", "/var/lib/slurm/slurmd"):  # fresh controller state: no leftover jobs
            for child in Path(d).iterdir():
                shutil.rmtree(child) if child.is_dir() else child.unlink()
        Path("/etc/slurm").mkdir(exist_ok=True)
        Path("/etc/slurm/slurm.conf").write_text(conf_text, encoding="utf-8")
        pidfile = Path("/run/munge/munged.pid")
        pidfile.unlink(missing_ok=True)
        subprocess.run(["runuser", "-u", "munge", "--", _which("munged"), "--force"], check=True, capture_output=True)
        _wait(pidfile.exists, 15, "munged's pid file")
        svc.pids.append(int(pidfile.read_text().split()[0]))
        _wait(lambda: subprocess.run("munge -n | unmunge", shell=True, capture_output=True).returncode == 0, 15, "munged")
        for argv in ([_which("slurmctld"), "-D", "-i"], [_which("slurmd"), "-D", "-N", "localhost"]):
            log = open(f"/var/log/slurm/{Path(argv[0]).name}.out", "ab")
            svc.pids.append(subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True).pid)
        _wait(lambda: subprocess.run(["sinfo", "-h", "-n", "localhost", "-o", "%t"], capture_output=True,
                                     text=True).stdout.strip().startswith("idle"), deadline_s, "the Slurm node to be idle")
    except BaseException:
        svc.stop()
        raise
    return svc


def pg_binaries() -> tuple[str, str] | None:
    for cand in (shutil.which("initdb") and os.path.dirname(os.path.realpath(shutil.which("initdb"))),
                 *sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)):
        if cand and os.path.exists(os.path.join(cand, "initdb")) and os.path.exists(os.path.join(cand, "pg_ctl")):
            return os.path.join(cand, "initdb"), os.path.join(cand, "pg_ctl")
    return None


def postgres_missing() -> str:
    if pg_binaries() is None:
        return "PostgreSQL is not installed (initdb/pg_ctl missing): apt-get install postgresql (bash .ci/setup --dev does)"
    if os.geteuid() == 0 and not _user_exists("postgres"):
        return "PostgreSQL refuses to run as root and there is no 'postgres' user to run it as"
    return ""


def _user_exists(name: str) -> bool:
    import pwd
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def start_postgres(deadline_s: float = 60.0) -> Service:
    """initdb a temp cluster (trust auth on loopback), start it on a free port; info['url'] is its URL."""
    initdb, pg_ctl = pg_binaries()
    root = tempfile.mkdtemp(prefix="agentrl-pg-")
    os.chmod(root, 0o755)
    data, sock = os.path.join(root, "data"), os.path.join(root, "sock")
    os.makedirs(sock)
    as_user: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
        shutil.chown(sock, "postgres", "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    from tests.conftest import free_port

    port = free_port()
    svc = Service(dirs=[root])
    try:
        subprocess.run([*as_user, initdb, "-D", data, "-U", "agentrl", "--auth=trust", "-E", "UTF8", "--no-sync"],
                       check=True, capture_output=True)
        opts = f"-c listen_addresses=127.0.0.1 -p {port} -k {sock} -c fsync=off -c max_connections=50"
        subprocess.run([*as_user, pg_ctl, "-D", data, "-o", opts, "-l", os.path.join(root, "log"), "-w", "-t", str(int(deadline_s)),
                        "start"], check=True, capture_output=True)
        pid = int(Path(data, "postmaster.pid").read_text().split()[0])
        svc.pids.append(pid)
    except BaseException:
        svc.stop()
        raise
    svc.info["url"] = f"postgresql://agentrl@127.0.0.1:{port}/postgres"
    svc.info["port"] = port
    return svc


def _wait(ok, deadline_s: float, what: str) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if ok():
            return
        time.sleep(0.25)
    raise TimeoutError(f"timed out after {deadline_s:.0f} s waiting for {what}")
