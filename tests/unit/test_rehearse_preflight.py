"""Simulated nodes refuse what they cannot do before touching the host: a subnet outside the
benchmarking range, a shared path that is not a directory, a user who is not root, a host without
iproute2; each error names the fix. A reclaim with nothing left does nothing. (Real namespaces:
tests/integration/test_rehearse_nodes.py.)"""

from __future__ import annotations

import pytest

from agentrl_cli.core.errors import UsageError
from agentrl_cli.ops.rehearse import host
from agentrl_cli.ops.rehearse.leftovers import reclaim
from agentrl_cli.ops.rehearse.nodes import Network


@pytest.mark.parametrize("subnet", ["10.0.0.0/24", "198.20.0.0/24", "198.18.0.0/31", "not a subnet"])
def test_a_subnet_outside_the_benchmarking_range_is_refused(subnet):
    with pytest.raises(UsageError) as caught:
        Network.create(subnet=subnet)
    assert "198.18.0.0/" in caught.value.hint or "198.18.0.0/" in caught.value.message


def test_a_shared_path_must_be_an_existing_directory(tmp_path):
    with pytest.raises(UsageError, match="existing directory"):
        Network.create(shared={"/data/runs": tmp_path / "missing"})


def test_not_root_is_refused_with_the_fix(monkeypatch):
    monkeypatch.setattr(host.os, "geteuid", lambda: 1000)
    with pytest.raises(host.NodesUnavailable) as caught:
        Network.create()
    assert "root" in caught.value.message and "sudo" in caught.value.hint


def test_a_missing_ip_command_is_refused_naming_iproute2(monkeypatch):
    monkeypatch.setattr(host.os, "geteuid", lambda: 0)
    monkeypatch.setattr(host.shutil, "which", lambda tool: None if tool == "ip" else f"/usr/bin/{tool}")
    with pytest.raises(host.NodesUnavailable) as caught:
        Network.create()
    assert "ip" in caught.value.message and caught.value.hint == "install them: apt-get install -y iproute2"


def test_reclaim_with_nothing_left_removes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr("agentrl_cli.ops.rehearse.leftovers.netns_names", lambda: [])
    assert reclaim(tmp_path / "state") == {"runs": 0, "namespaces": 0, "processes": 0, "dirs": 0, "errors": 0}
