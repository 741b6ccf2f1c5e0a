"""The compiled supervisor and the Python one, in real bubblewrap sandboxes: the compiled one runs
where a C compiler is, the Python one from bytecode compiled by the sandbox's own Python, and both
answer every kind of command the same way (output, invalid UTF-8, stdin, environment, exit codes,
signals, the output cap, the wall-clock deadline, background children)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from agentrl_cli.envs.sandbox import Sandbox, SandboxSettings
from agentrl_cli.envs.sandbox.bwrap import SANDBOX_UID, WORK
from agentrl_cli.envs.sandbox.limits import Limits
from agentrl_cli.envs.sandbox.supervisors import bytecode, compiled, support_dir
from tests.integration.conftest import needs_bwrap

pytestmark = [pytest.mark.integration, needs_bwrap]

COMMANDS = [
    ("echo out; echo err >&2; exit 3", {}),
    ("printf 'caf\\xc3\\xa9 \\xff\\xfe end'", {}),
    ("cat; echo", {"stdin": "from the host\n"}),
    ("echo \"$GREETING $PWD\"", {"env": {"GREETING": "hello"}, "cwd": "/tmp"}),
    ("kill -TERM $$", {}),
    ("yes | head -c 5000", {}),  # over the 1000-byte output cap below
    ("sleep 5", {"timeout": 0.5}),
    ("sleep 30 & echo started", {}),
    ("exec 1>&- 2>&-; sleep 0.2", {}),
    ("head -c 3000000 /dev/zero > big; echo $?; trap -p", {}),  # past the 2 MB file-size limit: EFBIG, not a signal
]


def _run_all(root: Path, supervisor: str) -> tuple[str, list[tuple]]:
    settings = SandboxSettings(root_dir=root, supervisor=supervisor, limits=Limits(output_limit_bytes=1000, max_file_size_mb=2))
    results = []
    with Sandbox(settings) as sb:
        kind = sb.describe()["supervisor"]
        for command, kwargs in COMMANDS:
            r = sb.exec(command, **kwargs)
            # over the output cap the command is killed, unless it ended first: its exit code is a race
            code = None if r.truncated else r.exit_code
            results.append((command, code, r.stdout, r.stderr, r.truncated, r.timed_out, r.killed_reason))
        missing = sb.exec(["no-such-program"])
        results.append(("no-such-program", missing.exit_code, "cannot run 'no-such-program'" in missing.stderr))
        assert sb.ping()
    return kind, results


def test_both_supervisors_answer_every_command_alike(sandbox_root):
    if compiled(support_dir(sandbox_root, SANDBOX_UID, WORK)) is None:
        pytest.skip("no C compiler here: only the Python supervisor runs")
    kind_c, from_c = _run_all(sandbox_root, "auto")
    kind_py, from_py = _run_all(sandbox_root, "python")
    assert (kind_c, kind_py) == ("compiled", "python")
    for a, b in zip(from_c, from_py):
        assert a == b
    by_command = {r[0]: r for r in from_c}
    assert by_command["echo out; echo err >&2; exit 3"][1:4] == (3, "out\n", "err\n")
    assert by_command["printf 'caf\\xc3\\xa9 \\xff\\xfe end'"][2] == "café \ufffd\ufffd end"
    assert by_command["kill -TERM $$"][1] == 128 + 15
    assert by_command["yes | head -c 5000"][4:] == (True, False, "output_limit")
    assert by_command["sleep 5"][5:] == (True, "wall_timeout")
    assert by_command["exec 1>&- 2>&-; sleep 0.2"][1] == 128 + 9  # closed its output and went on: stopped
    assert by_command["sleep 30 & echo started"][1:3] == (0, "started\n")
    assert "File too large" in by_command["head -c 3000000 /dev/zero > big; echo $?; trap -p"][3]


def test_the_supervisors_start_from_compiled_files(sandbox_root):
    support = support_dir(sandbox_root, SANDBOX_UID, WORK)
    for wanted, path in (("auto", "/.agentrl/supervisor-bin"), ("python", f"/.agentrl/{bytecode(support, '/usr/bin/python3')}")):
        if wanted == "auto" and compiled(support) is None:
            continue
        with Sandbox(SandboxSettings(root_dir=sandbox_root, supervisor=wanted)) as sb:
            assert path in sb.exec('tr "\\0" " " < /proc/$PPID/cmdline').stdout
    name = bytecode(support, "/usr/bin/python3")
    magic = subprocess.run(["/usr/bin/python3", "-I", "-S", "-c", "import importlib.util, sys; sys.stdout.write(importlib.util.MAGIC_NUMBER.hex())"],
                           capture_output=True, text=True, check=True).stdout
    assert name.endswith(".pyc") and (support / name).read_bytes()[:4].hex() == magic
    assert bytecode(support, str(sandbox_root / "no-python")) == "supervisor.py"  # nothing to compile with: the source


def test_without_a_compiler_the_python_supervisor_runs(sandbox_root, monkeypatch, tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))  # no cc here
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # and no supervisor compiled earlier on this host
    root = sandbox_root
    assert compiled(support_dir(root, SANDBOX_UID, WORK)) is None
    monkeypatch.undo()  # bubblewrap and the launcher programs are found again; the failed compile is remembered
    with Sandbox(SandboxSettings(root_dir=root)) as sb:
        assert sb.describe()["supervisor"] == "python"
        assert sb.exec("echo fine").stdout == "fine\n"
    assert not any(p.name == "supervisor-bin" for p in root.glob("support-*/*"))


def test_a_new_sandbox_root_copies_the_hosts_compiled_supervisor_instead_of_compiling(monkeypatch, tmp_path):
    """The first root compiles the supervisor and keeps it in the host's cache; a second root (another
    run directory) gets the same binary from there, even with no compiler left on PATH."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler here: only the Python supervisor runs")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    first = support_dir(tmp_path / "root-a", SANDBOX_UID, WORK)
    assert compiled(first) == "supervisor-bin"
    [cached] = (tmp_path / "cache" / "agentrl" / "sandbox").iterdir()
    assert cached.read_bytes() == (first / "supervisor-bin").read_bytes()
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))  # a compile would fail now
    second = support_dir(tmp_path / "root-b", SANDBOX_UID, WORK)
    assert compiled(second) == "supervisor-bin"
    assert (second / "supervisor-bin").read_bytes() == cached.read_bytes() and os.access(second / "supervisor-bin", os.X_OK)
