"""How a server process starts (`launcher.start_process`): it gets SIGTERM when the thread that started
it ends, and starting it is safe while another thread of the process imports and logs, as the trainer's
thread does while a run's servers start (`run/build.py`). A Python `preexec_fn` made the fork take the
interpreter's import lock after logging's: a thread holding the import lock that then logged deadlocked
both (seen as a `verify` run hung in its start-up)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from agentrl_cli.engines.inference import launcher

pytestmark = pytest.mark.integration

# a thread takes the import lock, as a thread importing a module does, and logs before releasing it
# (setuptools' modules call logging.getLogger at import); meanwhile the main thread starts a process
IMPORTING_THREAD = textwrap.dedent("""
    import _imp, logging, sys, threading, time
    from pathlib import Path
    from agentrl_cli.engines.inference import launcher
    if sys.argv[1] == "fallback":
        launcher._pdeathsig_wrapper = lambda: None
    held = threading.Event()
    def importing():
        _imp.acquire_lock()
        held.set()
        time.sleep(1.0)
        logging.getLogger("a.module.being.imported")
        _imp.release_lock()
    t = threading.Thread(target=importing)
    t.start()
    held.wait()
    server = launcher.start_process("child", [sys.executable, "-c", "pass"], "http://127.0.0.1:1", Path(sys.argv[2]))
    server.proc.wait()
    t.join()
    print("started", server.proc.returncode)
""")


def _start_beside_an_importing_thread(mode: str, logs, timeout_s: float) -> subprocess.CompletedProcess | None:
    """The script's result, None when it was still running after `timeout_s` (it takes about 3 s: the
    interpreter, agentrl's launcher, the thread's second)."""
    try:
        return subprocess.run([sys.executable, "-c", IMPORTING_THREAD, mode, str(logs)], capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None


def test_a_server_starts_while_another_thread_imports_and_logs(tmp_path):
    assert launcher.pdeathsig_safe_beside_threads()  # util-linux's setpriv, here as on every Debian
    done = _start_beside_an_importing_thread("setpriv", tmp_path, 120)
    assert done is not None, "start_process deadlocked against a thread holding the import lock"
    assert done.returncode == 0 and done.stdout.split() == ["started", "0"], done.stderr[-2000:]


def test_the_preexec_fallback_is_not_safe_beside_such_a_thread_so_a_run_does_not_overlap_there(tmp_path, monkeypatch):
    """Why `PartsBuilder` builds the trainer after the servers where setpriv is missing: the fallback
    deadlocks in exactly this case (the child is killed at the timeout)."""
    assert _start_beside_an_importing_thread("fallback", tmp_path, 8) is None
    monkeypatch.setattr(launcher, "_pdeathsig_wrapper", lambda: None)
    assert not launcher.pdeathsig_safe_beside_threads()


@pytest.mark.parametrize("wrapper", ["setpriv", "fallback"])
def test_a_server_gets_sigterm_when_the_thread_that_started_it_ends(tmp_path, monkeypatch, wrapper):
    if wrapper == "fallback":
        monkeypatch.setattr(launcher, "_pdeathsig_wrapper", lambda: None)
    started = []
    t = threading.Thread(target=lambda: started.append(
        launcher.start_process("sleeper", ["sleep", "600"], "http://127.0.0.1:1", tmp_path)))
    t.start()
    t.join()
    [server] = started
    try:
        assert server.proc.wait(timeout=30) == -signal.SIGTERM
    finally:
        server.stop(timeout_s=1)
    assert server.cmd == ["sleep", "600"]  # what `relaunch` starts again: the wrapper is added at each start

