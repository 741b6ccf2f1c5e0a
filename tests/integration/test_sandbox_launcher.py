"""The sandbox's first process is prepared by small programs exec'd in turn (sh joins the cgroups,
prlimit sets the rlimits, setpriv drops to the sandbox user) so the host starts it with vfork: the
limits, the user and the cgroups must hold exactly as with a Python preexec_fn."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentrl_cli.envs.sandbox.bwrap import SANDBOX_UID
from agentrl_cli.envs.sandbox.limits import Limits
from agentrl_cli.envs.sandbox.sandbox import Sandbox, SandboxSettings, _launcher
from tests.integration.conftest import needs_bwrap

pytestmark = [pytest.mark.integration, needs_bwrap,
              pytest.mark.skipif(os.geteuid() != 0, reason="the cgroups and the drop to the sandbox user need root here")]


def _limit(pid: int, name: str) -> str:
    line = next(x for x in Path(f"/proc/{pid}/limits").read_text().splitlines() if x.startswith(name))
    return line[len(name):].split()[0]


def test_the_first_process_runs_as_the_sandbox_user_inside_its_cgroups_with_the_rlimits(sandbox_root):
    limits = Limits(max_open_files=77, max_file_size_mb=3)
    with Sandbox(SandboxSettings(root_dir=sandbox_root, limits=limits)) as sb:
        assert _launcher(sb.cgroup, {}, SANDBOX_UID) is not None, "util-linux prlimit/setpriv expected on this host"
        assert sb.describe()["launch"] == "vfork, then sh, prlimit, setpriv"
        outer = sb.proc.pid
        status = Path(f"/proc/{outer}/status").read_text()
        uids = next(x for x in status.splitlines() if x.startswith("Uid:")).split()[1:]
        assert uids == [str(SANDBOX_UID)] * 4
        groups = next(x for x in status.splitlines() if x.startswith("Groups:")).split()[1:]
        assert groups == []
        assert Path(f"/proc/{outer}/comm").read_text().strip() == "bwrap"
        assert _limit(outer, "Max open files") == "77"
        assert _limit(outer, "Max file size") == str(3 * 1024 * 1024)
        assert _limit(outer, "Max core file size") == "0"
        assert outer in sb.processes()  # every cgroup of the sandbox holds it
        for d in sb.cgroup.dirs.values():
            assert str(outer) in (d / "cgroup.procs").read_text().split()
        inside = sb.exec("ulimit -n; ulimit -f; id -u")
        assert inside.stdout.split() == ["77", str(3 * 1024), str(SANDBOX_UID)]
