"""The work directory as root runs it: a size-limited tmpfs in the sandbox's own mount namespace,
never mounted in the host's, read and written by the host through a directory fd opened before
any command ran."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentrl_cli.envs.sandbox import Sandbox, SandboxSettings
from agentrl_cli.envs.sandbox.bwrap import SANDBOX_UID
from tests.integration.conftest import needs_bwrap

pytestmark = [pytest.mark.integration, needs_bwrap,
              pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox's own tmpfs and the host's view of it need root here")]


def _host_mounts() -> str:
    return Path("/proc/self/mountinfo").read_text()


def _sandbox_mounts(before: str, root: Path) -> list[str]:
    """The host's mounts made since `before` that could be the sandbox's: under its root, or a tmpfs of
    its work dir's size. Not a count of all mounts: tests beside this one add theirs (a rehearsal's
    network namespaces)."""
    new = set(_host_mounts().splitlines()) - set(before.splitlines())
    return [m for m in new if str(root) in m or (" - tmpfs " in m and "size=8192k" in m)]


def test_the_work_dir_is_a_tmpfs_of_the_sandbox_and_no_host_mount(sandbox_root):
    before = _host_mounts()
    with Sandbox(SandboxSettings(root_dir=sandbox_root, workdir_size_mb=8)) as sb:
        assert sb.describe()["workdir"] == "tmpfs" and sb.workdir_fd is not None
        assert _sandbox_mounts(before, sandbox_root) == [] and str(sb.base) not in _host_mounts()
        inside = sb.exec("stat -c '%u %a' /work; df -k /work | tail -1 | awk '{print $2}'; grep ' /work ' /proc/self/mounts")
        owner_mode, size_kb, mount = inside.stdout.splitlines()
        assert owner_mode == f"{SANDBOX_UID} 700" and int(size_kb) == 8 * 1024 and mount.startswith("tmpfs /work tmpfs")
        sb.write_file("task/input.txt", "from the host\n")
        r = sb.exec("stat -c '%u' task task/input.txt; cat task/input.txt; echo made by the agent > out.txt")
        assert r.stdout.split("\n")[:3] == [str(SANDBOX_UID), str(SANDBOX_UID), "from the host"]
        assert sb.read_file("out.txt") == b"made by the agent\n"
        for pid in sb.processes():  # everything inside dies: the evidence is still readable through the fd
            os.kill(pid, 9)
        assert sb.read_file("out.txt") == b"made by the agent\n"
    assert sb.workdir_fd is None and not sb.base.exists()
    assert _sandbox_mounts(before, sandbox_root) == []
