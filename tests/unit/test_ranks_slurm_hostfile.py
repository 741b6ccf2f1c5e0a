"""Inside a Slurm allocation, with cluster.nodes > 1 and no hostfile given (no argument, no
DLTS_HOSTFILE, no /job/hostfile), the launcher's hosts come from the allocation: `scontrol show
hostnames "$SLURM_JOB_NODELIST"` becomes `<control>/hostfile`, this host first; an allocation of fewer
nodes than cluster.nodes is refused with the fix. A stand-in `scontrol` on PATH expands the node list
as Slurm would for the lists used here."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from agentrl_cli.config.models import PlatformConfig
from agentrl_cli.core.errors import ConfigError
from agentrl_cli.learner.ranks_backend import DEFAULT_HOSTFILE, launcher_command

pytestmark = pytest.mark.skipif(Path(DEFAULT_HOSTFILE).exists(), reason=f"{DEFAULT_HOSTFILE} exists here and would be used")

# `scontrol show hostnames LIST`: one host a line; records its arguments so the test sees what it was asked
SCONTROL = """#!/bin/sh
echo "$@" >> "$(dirname "$0")/asked"
case "$3" in
  "node-[1-2]") printf 'node-1\\nnode-2\\n' ;;
  "HERE,node-9") printf 'node-9\\n%s\\n' "$(hostname)" ;;
  "node-1") echo node-1 ;;
  *) echo "scontrol: error: Invalid hostlist: $3" >&2; exit 1 ;;
esac
"""


@pytest.fixture
def scontrol(tmp_path, monkeypatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "scontrol"
    tool.write_text(SCONTROL)
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.delenv("DLTS_HOSTFILE", raising=False)
    return bin_dir / "asked"


def _two_nodes(world: int = 4) -> PlatformConfig:
    return PlatformConfig.model_validate({"cluster": {"nodes": 2}, "training": {"world_size": world, "master_port": 29613}})


def _arg(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_inside_an_allocation_the_hostfile_is_written_from_its_node_list(tmp_path, scontrol, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node-[1-2]")
    argv = launcher_command(_two_nodes(), tmp_path / "m", tmp_path / "control")
    written = tmp_path / "control" / "hostfile"
    assert _arg(argv, "--hostfile") == str(written) and _arg(argv, "--num_nodes") == "2"
    assert written.read_text() == "node-1 slots=2\nnode-2 slots=2\n"  # world_size 4 over 2 nodes
    assert _arg(argv, "--master_addr") == "node-1"
    assert scontrol.read_text() == "show hostnames node-[1-2]\n"


def test_this_host_comes_first_whatever_its_place_in_the_node_list(tmp_path, scontrol, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_NODELIST", "HERE,node-9")
    argv = launcher_command(_two_nodes(world=2), tmp_path / "m", tmp_path / "control")
    here = socket.gethostname()
    assert (tmp_path / "control" / "hostfile").read_text() == f"{here} slots=1\nnode-9 slots=1\n"
    assert _arg(argv, "--master_addr") == here  # rank 0, and the command channel, are on the run's host


def test_an_allocation_with_fewer_nodes_than_cluster_nodes_is_refused_with_the_fix(tmp_path, scontrol, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node-1")
    with pytest.raises(ConfigError) as caught:
        launcher_command(_two_nodes(), tmp_path / "m", tmp_path / "control")
    assert "cluster.nodes=2" in caught.value.message and "has 1 node(s): node-1" in caught.value.message
    assert "sbatch --nodes=2" in caught.value.hint and "cluster.nodes: 1" in caught.value.hint
    assert not (tmp_path / "control" / "hostfile").exists()


def test_a_node_list_scontrol_cannot_expand_is_refused_with_its_words(tmp_path, scontrol, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node-[")
    with pytest.raises(ConfigError, match="Invalid hostlist"):
        launcher_command(_two_nodes(), tmp_path / "m", tmp_path / "control")


def test_a_given_hostfile_wins_over_the_allocation(tmp_path, scontrol, monkeypatch):
    mine = tmp_path / "mine"
    mine.write_text("a slots=2\nb slots=2\n")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node-[1-2]")
    assert _arg(launcher_command(_two_nodes(), tmp_path / "m", tmp_path / "c", hostfile=mine), "--hostfile") == str(mine)
    monkeypatch.setenv("DLTS_HOSTFILE", str(mine))
    assert _arg(launcher_command(_two_nodes(), tmp_path / "m", tmp_path / "c"), "--hostfile") == str(mine)
    assert not scontrol.exists()  # Slurm was never asked


def test_outside_an_allocation_a_missing_hostfile_names_every_way_to_give_the_hosts(tmp_path, scontrol, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_NODELIST", raising=False)
    with pytest.raises(ConfigError) as caught:
        launcher_command(_two_nodes(), tmp_path / "m", tmp_path / "c")
    assert "DLTS_HOSTFILE" in caught.value.hint and "Slurm allocation of 2 nodes" in caught.value.hint
    assert not scontrol.exists()
