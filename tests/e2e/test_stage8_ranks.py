"""`agentrl stage run 8 --phase smoke --set training.world_size=2` on a random tiny model: the real
loop trains through two ranks under torchrun, checkpoints from both, and a second run resumes from
the checkpoint with two new ranks. Run with FSDP2 (`training.backend: fsdp`) in CI; DeepSpeed's two
ranks go through the same launcher in the chaos test (tests/e2e/test_chaos.py: a stage 8 run with
two DeepSpeed ranks, one killed and the run resumed from its checkpoint). Add "deepspeed" to
BACKENDS to run it here too (RANK_FILES knows its files)."""

from __future__ import annotations

import json
import shutil

import pytest

from agentrl_cli.learner.ranks_backend import _is_rank

pytestmark = [pytest.mark.e2e, pytest.mark.integration,
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")]


# every file each rank writes into a checkpoint, by backend
RANK_FILES = {"deepspeed": ("ckpt", "zero_pp_rank_*_optim_states.pt",
                            {"zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt"}),
              "fsdp": ("shards", "__*_*.distcp", {"__0_0.distcp", "__1_0.distcp"})}


BACKENDS = ["fsdp"]  # CI time: DeepSpeed's two ranks are the chaos test's


@pytest.mark.parametrize("backend", BACKENDS)
def test_stage_8_smoke_trains_with_two_ranks_checkpoints_and_resumes(cli, quick_sets, isolated, backend):
    result, data = cli.json("stage", "run", "8", "--phase", "smoke", *quick_sets, "--set", "training.world_size=2",
                            "--set", f"training.backend={backend}")
    report = data["reports"][0]
    by_name = {c["name"]: c for c in report["checks"]}
    for name in ("loss finite", "checkpoint written", "reloaded and resumed", "no trajectory stored twice"):
        assert by_name[name]["status"] == "pass", (name, by_name[name]["detail"][-600:])
    assert by_name["reloaded and resumed"]["measured"] == {"resumed_from": "step-00000002", "start_step": 2, "end_step": 4}
    # with a random model the reward may be all zero: then the check must fail, never pass quietly
    degenerate = by_name["reward distribution not degenerate"]
    assert (degenerate["status"] == "pass") == (result.exit_code == 0)

    [stage8] = list((isolated / "runs").glob("*/stage8"))
    log = (stage8 / "logs" / "trainer-ranks.log").read_text()
    assert log.count("torch.distributed.run --nproc_per_node 2") == 2  # the first run and the resumed one
    where, pattern, expected = RANK_FILES[backend]
    newest = sorted((stage8 / "checkpoints").glob("step-*"))[-1] / "engine" / where
    assert {p.name for p in newest.glob(pattern)} == expected  # both ranks wrote
    pids = json.loads((stage8 / "trainer-ranks" / "channel.json").read_text())["pids"]
    assert len(pids) == 2 and not any(_is_rank(pid) for pid in pids)  # the run reaped its ranks
