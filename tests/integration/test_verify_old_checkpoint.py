"""Checkpoints must load across versions: the checkpoint kept from each format version loads with
this version's code and takes a finite step; a damaged copy is refused, never half-loaded."""

from __future__ import annotations

import shutil

import pytest

from agentrl_cli.acceptance.verify.old_checkpoint import fixtures, load_and_step

pytestmark = pytest.mark.integration


def test_every_kept_format_version_loads_and_trains():
    kept = fixtures()
    assert kept and kept[0].name == "checkpoint-v1"
    for root in kept:
        result = load_and_step(root)
        assert result["ok"] and result["step"] == 1 and result["loss_after_one_step"] is not None, result


def test_a_damaged_copy_is_refused(tmp_path):
    copy = tmp_path / "checkpoint-v1"
    shutil.copytree(fixtures()[0], copy)
    states = next(copy.rglob("*optim_states.pt"))
    states.write_bytes(states.read_bytes()[:100])
    result = load_and_step(copy)
    assert result == {"ok": False, "why": f"no complete checkpoint under {copy / 'checkpoints'}"}
