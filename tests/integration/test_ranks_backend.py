"""Trainer ranks under torchrun, driven through `RanksBackend` (gloo on CPU, a random tiny model):
two ranks lose what one rank loses on the same samples, a SIGKILLed rank is named and a new set of
ranks resumes from the last checkpoint, and ranks that never open their channel end in a named
error with nothing left running."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pytest
import torch

from agentrl_cli.config.models import PlatformConfig
from agentrl_cli.core.errors import AgentrlError, ConfigError, NotFoundError
from agentrl_cli.learner.backend import STEP_METRICS, TrainingBackend
from agentrl_cli.learner.deepspeed_backend import DeepSpeedBackend
from agentrl_cli.learner.grpo import Sample, collate, group_advantages, token_logprobs
from agentrl_cli.learner.rank_worker import combine_metrics, shard
from agentrl_cli.learner.ranks_backend import (RanksBackend, TrainerRanksFailed, _is_rank, failed_ranks,
                                                launcher_command)

pytestmark = pytest.mark.integration

PROMPT = "Fix the function `add(a, b)` in calc.py so that the tests pass. Use the tools."
TURNS = ["I will read the file first.", "calc.py returns a - b; it should return a + b.",
         "Let me run the tests again to be sure the fix holds for negative numbers as well.",
         "Done.", "The bug was the operator.", "I edited calc.py, ran pytest, and every test passes now."]
TOOL = "===== 3 passed in 0.02s ====="


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from agentrl_cli.model.tiny import build_random

    return build_random(tmp_path_factory.mktemp("ranks") / "tiny", seed=3)


@pytest.fixture(scope="module")
def steps_samples(model_dir) -> list[list[Sample]]:
    """Three steps of six episodes tokenized by the model's tokenizer: prompt and tool output out of
    the loss, the model's turns in it with the starting model's log-probs; turns of different
    lengths, so each rank's contiguous half holds a different number of trained tokens."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    steps = []
    for step in range(3):
        episodes, rewards = [], []
        for i in range(6):
            prompt, turn, tool = (tok(t, add_special_tokens=False)["input_ids"] for t in (PROMPT, TURNS[(i + step) % 6], TOOL))
            ids = prompt + turn + tool
            mask = [0] * len(prompt) + [1] * len(turn) + [0] * len(tool)
            with torch.no_grad():
                lp, _ = token_logprobs(model, collate([Sample(ids, mask, [0.0] * len(ids), 0.0)], 0))
            episodes.append((ids, mask, lp[0].numpy()))
            rewards.append(float((i * 7 + step) % 3 == 0))
        adv = group_advantages(rewards, [f"s{step}g{i // 3}" for i in range(6)])
        steps.append([Sample(ids, mask, lp, a) for (ids, mask, lp), a in zip(episodes, adv)])
    return steps


def ranks_config(**training) -> PlatformConfig:
    cfg = PlatformConfig()
    settings = {"world_size": 2, "micro_batch_size": 2, "learning_rate": 1e-3, "zero_stage": 2, "seed": 7, **training}
    return cfg.model_copy(update={"training": cfg.training.model_copy(update=settings)})


def trained_tokens(samples: list[Sample]) -> int:
    return int(sum(collate([s], 0).loss_mask.sum() for s in samples))


@pytest.fixture(scope="module")
def two_ranks(model_dir, steps_samples, tmp_path_factory):
    """Two ranks that trained the three steps, checkpointed after the first; still running."""
    root = tmp_path_factory.mktemp("two-ranks")
    ranks = RanksBackend(model_dir, ranks_config(), root / "run")
    try:
        metrics = [ranks.train_step(steps_samples[0])]
        ranks.save_checkpoint(root / "ckpt" / "engine", {"step": 1, "note": "after one"})
        metrics += [ranks.train_step(s) for s in steps_samples[1:]]
        yield ranks, metrics, root
    finally:
        ranks.close()


def test_two_ranks_lose_the_same_per_step_as_one_rank_on_the_same_samples(model_dir, steps_samples, two_ranks):
    ranks, two, root = two_ranks
    halves = [[trained_tokens(shard(s, r, 2)[0]) for r in (0, 1)] for s in steps_samples]
    assert all(a != b for a, b in halves)  # the ranks hold different token counts every step
    assert isinstance(ranks, TrainingBackend) and (ranks.rank, ranks.world_size) == (0, 2)
    assert [m["step"] for m in two] == [1, 2, 3]
    one = DeepSpeedBackend(model_dir, ranks_config().training)
    try:
        single = [one.train_step(s) for s in steps_samples]
    finally:
        one.close()

    print("per-step loss, 1 rank:", [m["loss"] for m in single], "2 ranks:", [m["loss"] for m in two])
    assert [m["loss"] for m in two] == pytest.approx([m["loss"] for m in single], rel=1e-4, abs=1e-6)
    assert len({round(m["loss"], 6) for m in single}) == 3  # the model moved between steps
    for a, b in zip(two, single):
        assert set(STEP_METRICS) <= set(a)
        assert (a["tokens"], a["samples"]) == (b["tokens"], b["samples"])
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-3)
        assert a["entropy"] == pytest.approx(b["entropy"], rel=1e-4)
    assert (root / "run" / "logs" / "trainer-ranks.log").stat().st_size > 0


def test_a_killed_rank_is_named_and_new_ranks_resume_from_the_last_checkpoint(model_dir, steps_samples, two_ranks):
    first, metrics, root = two_ranks
    os.kill(first.pids[1], signal.SIGKILL)
    with pytest.raises(TrainerRanksFailed) as failed:
        first.train_step(steps_samples[0])
    assert failed.value.rank == 1 and failed.value.exit_status == -signal.SIGKILL
    assert "trainer rank 1 of 2 died" in failed.value.message and "SIGKILL" in failed.value.message
    assert isinstance(failed.value, AgentrlError) and failed.value.hint
    with pytest.raises(TrainerRanksFailed, match="rank 1"):  # every later call says the same
        first.named_parameter_sample(["lm_head.weight"], 2)
    first.close()
    assert not any(_is_rank(pid) for pid in first.pids)  # close() reaped every rank

    again = RanksBackend(model_dir, ranks_config(), root / "run")
    try:
        with pytest.raises(NotFoundError, match="no DeepSpeed checkpoint"):  # a rank's own error, as its type
            again.load_checkpoint(root / "nowhere")
        assert again.load_checkpoint(root / "ckpt" / "engine") == {"step": 1, "note": "after one"}
        assert again.step == 1
        assert again.train_step(steps_samples[1])["loss"] == pytest.approx(metrics[1]["loss"], rel=1e-6, abs=1e-9)
        assert again.step == 2
    finally:
        again.close()
    assert not any(_is_rank(pid) for pid in again.pids)


def test_ranks_that_never_open_their_channel_end_in_a_named_error_with_nothing_left(model_dir, tmp_path):
    with pytest.raises(TrainerRanksFailed, match="did not open their command channel within 1 s") as failed:
        RanksBackend(model_dir, ranks_config(), tmp_path / "run", start_timeout_s=1)
    assert "trainer-ranks.log ends with" in failed.value.message
    leftover = [p for p in os.listdir("/proc") if p.isdigit() and _is_rank(int(p))
                and str(tmp_path) in Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace")]
    assert leftover == []


# ---- pieces without processes ---------------------------------------------------------------------

def test_shards_are_contiguous_and_padded_to_the_same_number_of_samples(steps_samples):
    samples = steps_samples[0][:5]
    (a, real_a), (b, real_b) = shard(samples, 0, 2), shard(samples, 1, 2)
    assert (real_a, real_b) == (3, 2) and len(a) == len(b) == 3
    assert [s.advantage for s in a + b[:2]] == [s.advantage for s in samples]
    assert np.asarray(b[2].loss_mask).sum() == 0 and b[2].advantage == 0.0  # padding trains nothing


def test_combined_metrics_average_the_loss_and_weight_diagnostics_by_tokens():
    parts = [{"loss": 0.2, "entropy": 1.0, "tokens": 30, "samples": 3, "grad_norm": 0.5, "lr": 1e-3, "step": 4},
             {"loss": 0.4, "entropy": 4.0, "tokens": 10, "samples": 2, "grad_norm": 0.5, "lr": 1e-3, "step": 4}]
    out = combine_metrics(parts)
    assert out["loss"] == pytest.approx(0.3) and out["entropy"] == pytest.approx(1.75)
    assert (out["tokens"], out["samples"], out["step"], out["grad_norm"]) == (40, 5, 4, 0.5)


def test_the_launcher_log_names_the_rank_killed_by_a_signal_first():
    log = ("Failures:\n[1]:\n  time      : x\n  host      : h\n  rank      : 0 (local_rank: 0)\n  exitcode  : 1 (pid: 5)\n"
           "Root Cause (first observed failure):\n[0]:\n  time      : x\n  host      : h\n  rank      : 1 (local_rank: 1)\n"
           "  exitcode  : -9 (pid: 6)\n  error_file: <N/A>\n  traceback : Signal 9 (SIGKILL) received by PID 6\n"
           "[2]:\n  rank      : 2 (local_rank: 0)\n  exitcode  : -15 (pid: 7)\n")
    assert failed_ranks(log) == [(1, -9), (0, 1), (2, -15)]


def test_several_nodes_launch_through_the_deepspeed_launcher_and_its_hostfile(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node-a slots=2\nnode-b slots=2  # second\n")
    cfg = ranks_config(world_size=4)
    cfg = cfg.model_copy(update={"cluster": cfg.cluster.model_copy(update={"nodes": 2})})
    cmd = launcher_command(cfg, tmp_path / "m", tmp_path / "c", port=29555, hostfile=hostfile)
    assert cmd[1:3] == ["-m", "deepspeed.launcher.runner"]
    joined = " ".join(cmd)
    assert "--num_nodes 2 --num_gpus 2 --master_addr node-a --master_port 29555" in joined
    assert "--module agentrl_cli.learner.rank_worker" in joined
    with pytest.raises(ConfigError, match="not a multiple of cluster.nodes"):
        launcher_command(ranks_config(world_size=3).model_copy(update={"cluster": cfg.cluster}), tmp_path, tmp_path,
                         hostfile=hostfile)
    with pytest.raises(ConfigError, match="needs a hostfile"):
        launcher_command(cfg, tmp_path, tmp_path, hostfile=tmp_path / "missing")
