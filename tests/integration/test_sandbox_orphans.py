"""Sandboxes whose owner was killed (no close, no cleanup) are reclaimed: their processes killed,
cgroups removed, tmpfs unmounted, directories deleted; a live process's sandboxes are untouched."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agentrl_cli.envs.sandbox.orphans import orphaned, reclaim_orphans
from agentrl_cli.envs.sandbox.sandbox import Sandbox, SandboxSettings
from tests.integration.conftest import needs_bwrap

pytestmark = [pytest.mark.integration, needs_bwrap]
ROOT = Path(__file__).resolve().parents[2]


def _mounted(path: Path) -> bool:
    return any(line.split()[4] == str(path) for line in Path("/proc/self/mountinfo").read_text().splitlines())


def _start_and_get_killed(root: Path) -> dict:
    """A child process starts a sandbox (with a process left running inside), reports it, and is SIGKILLed."""
    code = textwrap.dedent(f"""
        import json, sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from agentrl_cli.envs.sandbox.sandbox import Sandbox, SandboxSettings
        sb = Sandbox(SandboxSettings(root_dir=__import__("pathlib").Path({str(root)!r})))
        sb.exec("nohup sleep 300 >/dev/null 2>&1 &")
        print(json.dumps({{"id": sb.id, "workdir": str(sb.workdir), "mounted": sb.workdir_mounted,
                          "cgroups": [str(d) for d in sb.cgroup.dirs.values()] if sb.cgroup else [],
                          "pids": sorted(sb.processes())}}), flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        facts = json.loads(proc.stdout.readline())
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    return facts


def test_a_killed_owners_sandbox_is_reclaimed_and_a_live_one_is_not(sandbox_root):
    os.chmod(sandbox_root, 0o755)  # as sandbox.root_dir is: the sandbox user passes through to a run's directory
    run_dir = sandbox_root / "run-0123456789ab"
    facts = _start_and_get_killed(run_dir)
    workdir = Path(facts["workdir"])
    assert workdir.exists() and facts["pids"]
    assert [Path(c).exists() for c in facts["cgroups"]] == [True] * len(facts["cgroups"])
    if facts["mounted"]:
        assert _mounted(workdir)
    with Sandbox(SandboxSettings(root_dir=sandbox_root)) as mine:
        assert [p.name for p in orphaned(sandbox_root)] == [facts["id"]]
        counts = reclaim_orphans(sandbox_root)
        assert counts["sandboxes"] == 1 and counts["errors"] == 0
        assert counts["cgroups"] == len(facts["cgroups"])
        assert counts["mounts"] == (1 if facts["mounted"] else 0)
        assert not workdir.parent.exists() and not run_dir.exists()
        assert not _mounted(workdir)
        assert not any(Path(c).exists() for c in facts["cgroups"])
        for pid in facts["pids"]:
            assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
        assert mine.alive and mine.exec("echo still here").stdout.strip() == "still here"
        assert reclaim_orphans(sandbox_root)["sandboxes"] == 0
    assert os.listdir(sandbox_root) == [p for p in os.listdir(sandbox_root) if p.startswith("support-")]
