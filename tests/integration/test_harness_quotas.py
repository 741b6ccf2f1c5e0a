"""Per-harness quotas take effect on that harness's sandboxes: `harnesses[].cpu` is a cgroup CPU
quota (a busy loop gets at most that share of a core) and `memory_gb` a memory limit."""

from __future__ import annotations

import json

import pytest

from agentrl_cli.config.models import HarnessConfig, SandboxConfig
from agentrl_cli.envs.sandbox import Sandbox
from agentrl_cli.envs.sandbox.cgroups import CgroupSet
from agentrl_cli.envs.sandbox.provider import harness_settings
from tests.integration.conftest import needs_bwrap

pytestmark = [pytest.mark.integration, needs_bwrap]

BUSY = ("import json, os, time\nt0 = time.monotonic()\nwhile time.monotonic() - t0 < 2.0:\n    pass\n"
        "print(json.dumps({'wall': time.monotonic() - t0, 'cpu': time.process_time()}))")


def _cgroups_here() -> bool:
    probe = CgroupSet.create("quota-probe", 8, 64 << 20, 0.5)
    if probe is None:
        return False
    probe.destroy()
    return True


needs_cgroups = pytest.mark.skipif(not _cgroups_here(), reason="no writable cgroup cpu/memory controllers on this host")


@needs_cgroups
def test_half_a_core_quota_holds_a_busy_loop_to_half_a_core(tmp_path):
    settings = harness_settings(SandboxConfig(), HarnessConfig(name="terminal_like", cpu=0.5))
    assert settings.limits.cpu_cores == 0.5
    with Sandbox(settings) as sb:
        r = sb.exec(["python3", "-c", BUSY], timeout=20)
    used = json.loads(r.stdout)
    assert used["cpu"] / used["wall"] <= 0.6, used  # the quota: 50 ms of CPU per 100 ms period, plus scheduling slack


@needs_cgroups
def test_the_quota_is_the_sandbox_cgroups_own_and_absent_without_cpu(tmp_path):
    quota = harness_settings(SandboxConfig(), HarnessConfig(name="terminal_like", cpu=0.5))
    free = harness_settings(SandboxConfig(), HarnessConfig(name="terminal_like"))
    assert free.limits.cpu_cores is None
    with Sandbox(quota) as limited, Sandbox(free) as unlimited:
        assert (limited.cgroup.dirs["cpu"] / "cpu.cfs_quota_us").read_text().strip() == "50000"
        assert "cpu" not in unlimited.cgroup.dirs


def test_a_quarter_gigabyte_harness_is_stopped_at_its_memory_limit(tmp_path):
    settings = harness_settings(SandboxConfig(memory_mb=2048),
                                HarnessConfig(name="terminal_like", memory_gb=0.25))
    assert settings.limits.memory_mb == 256
    grab = "x = []\nfor i in range(64):\n    x.append(bytearray(8 << 20))\nprint('kept', len(x) * 8, 'MB')"
    with Sandbox(settings) as sb:
        small = sb.exec(["python3", "-c", grab.replace("range(64)", "range(8)")])
        big = sb.exec(["python3", "-c", grab])
    assert small.exit_code == 0 and "kept 64 MB" in small.stdout
    assert big.exit_code != 0 and "kept" not in big.stdout
    assert big.killed_reason == "memory" or "MemoryError" in big.stderr
