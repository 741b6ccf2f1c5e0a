"""The DeepSpeed backend on a random tiny model, on CPU with gloo: updates go the right way, masked
tokens do not count, a checkpoint resumes exactly, exported weights are the trained ones, and two
ranks under torchrun end with identical parameters."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agentrl_cli.config.models import TrainingConfig
from agentrl_cli.core.errors import ConfigError
from agentrl_cli.learner.backend import STEP_METRICS, TrainingBackend
from agentrl_cli.learner.deepspeed_backend import DeepSpeedBackend, build_deepspeed_config
from agentrl_cli.learner.grpo import Sample, collate, token_logprobs
from tests.conftest import free_port

pytestmark = pytest.mark.integration

PROMPT = [60, 61, 62, 63, 64, 65]
COMPLETION = [70, 71, 72, 73, 74, 75, 76, 77]
TOOL = [90, 91, 92, 93]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from agentrl_cli.model.tiny import build_random

    return build_random(tmp_path_factory.mktemp("ds") / "tiny", seed=3)


@pytest.fixture
def make_backend(model_dir):
    made: list[DeepSpeedBackend] = []

    def make(**overrides) -> DeepSpeedBackend:
        if made:  # one process group per process: close the previous backend first (the ones before it are)
            made[-1].close()
        cfg = TrainingConfig(**{"micro_batch_size": 2, "learning_rate": 1e-3, "zero_stage": 2, **overrides})
        made.append(DeepSpeedBackend(model_dir, cfg))
        return made[-1]

    yield make
    made[-1].close() if made else None


def episode(advantage: float, logprobs: list[float] | None = None, tool: list[int] = TOOL) -> Sample:
    """prompt (masked) + completion (trained) + trailing tool output (masked)."""
    ids = PROMPT + COMPLETION + tool
    mask = [0] * len(PROMPT) + [1] * len(COMPLETION) + [0] * len(tool)
    return Sample(ids, mask, logprobs if logprobs is not None else [-5.5] * len(ids), advantage)


def completion_logprob(backend) -> float:
    batch = collate([episode(0.0)], backend.pad_id)
    with torch.no_grad():
        lp, _ = token_logprobs(backend.module, batch)
    return float((lp * batch.loss_mask).sum())


def on_policy(backend, advantage: float) -> Sample:
    s = episode(advantage)
    with torch.no_grad():
        lp, _ = token_logprobs(backend.module, collate([s], backend.pad_id))
    return episode(advantage, lp[0].tolist())


def all_params(backend) -> dict[str, torch.Tensor]:
    names = [n for n, _ in backend.module.named_parameters()]
    return {k: torch.tensor(v) for k, v in backend.named_parameter_sample(names, sys.maxsize).items()}


def test_train_step_reports_finite_metrics_and_counts_one_optimizer_step(make_backend):
    backend = make_backend()
    assert isinstance(backend, TrainingBackend)
    samples = [episode(1.0), episode(-1.0), episode(0.5, tool=[95])]  # 2 micro-batches, one step
    metrics = backend.train_step(samples)
    assert set(STEP_METRICS) <= set(metrics)
    assert all(math.isfinite(metrics[k]) for k in STEP_METRICS)
    assert metrics["grad_norm"] > 0 and metrics["tokens"] == 3 * len(COMPLETION) and metrics["samples"] == 3
    assert backend.step == 1 and (backend.rank, backend.world_size) == (0, 1)


@pytest.mark.parametrize("advantage", [1.0, -1.0])
def test_advantage_sign_sets_the_direction_of_the_completion_log_prob(make_backend, advantage):
    backend = make_backend()
    before = completion_logprob(backend)
    first = backend.train_step([on_policy(backend, advantage)] * 2)
    assert first["mismatch_kl"] < 1e-6  # log-probs came from these very weights
    for _ in range(3):
        backend.train_step([on_policy(backend, advantage)] * 2)
    change = completion_logprob(backend) - before
    assert change * advantage > 0.05


def test_kl_coef_anchors_the_policy_to_the_frozen_starting_model(make_backend):
    backend = make_backend(kl_coef=0.5)
    first = backend.train_step([on_policy(backend, 1.0)] * 2)
    assert first["kl_ref"] == pytest.approx(0.0, abs=1e-6)  # the policy still is the reference
    for _ in range(3):
        last = backend.train_step([on_policy(backend, 1.0)] * 2)
    assert last["kl_ref"] > 1e-4  # it moved away, and the penalty sees it
    plain = make_backend()  # kl_coef 0: no reference is loaded and none is reported
    assert plain.reference is None and "kl_ref" not in plain.train_step([on_policy(plain, 1.0)] * 2)


def test_tokens_outside_the_loss_mask_do_not_change_the_update(make_backend):
    plain = episode(1.0)
    n = len(plain.token_ids)
    mask = plain.loss_mask
    garbage = [lp if m else (80.0 if i % 2 else -1e4) for i, (lp, m) in enumerate(zip(plain.logprobs, mask))]
    perturbed = episode(1.0, garbage, tool=[3, 2, 1, 0])  # other trailing tool tokens, nonsense masked log-probs
    assert len(perturbed.token_ids) == n

    deltas = []
    for sample in (plain, perturbed):
        backend = make_backend()
        start = all_params(backend)
        backend.train_step([sample, episode(-1.0, tool=[])])  # the second one adds padding
        deltas.append({k: v - start[k] for k, v in all_params(backend).items()})
    assert any(d.abs().max() > 0 for d in deltas[0].values())
    for name in deltas[0]:
        torch.testing.assert_close(deltas[1][name], deltas[0][name], rtol=0, atol=1e-7, msg=name)


def test_adaptive_entropy_control_raises_the_bonus_below_the_target_lowers_it_above_and_resumes_it(make_backend, tmp_path):
    # the random tiny model's token entropy is about 7.3 nats: a target above it pushes, one below lets go
    below = make_backend(entropy_target=9.0, entropy_coef=0.01, entropy_coef_step=0.004, entropy_coef_max=0.02)
    coefs = [below.train_step([episode(1.0), episode(-1.0)])["entropy_coef"] for _ in range(4)]
    assert coefs == pytest.approx([0.01, 0.014, 0.018, 0.02])  # up a step after each, held at the max
    below.save_checkpoint(tmp_path / "ck", {"step": 4})
    fresh = make_backend(entropy_target=9.0, entropy_coef=0.0, entropy_coef_step=0.004, entropy_coef_max=0.02)
    fresh.load_checkpoint(tmp_path / "ck")
    assert fresh.train_step([episode(1.0), episode(-1.0)])["entropy_coef"] == pytest.approx(0.02)
    above = make_backend(entropy_target=1.0, entropy_coef=0.005, entropy_coef_step=0.004)
    coefs = [above.train_step([episode(1.0), episode(-1.0)])["entropy_coef"] for _ in range(3)]
    assert coefs == pytest.approx([0.005, 0.001, 0.0])  # down a step after each, never below 0
    fixed = make_backend(entropy_coef=0.01)  # no target: the bonus stays where it is set
    assert [fixed.train_step([episode(1.0), episode(-1.0)])["entropy_coef"] for _ in range(2)] == [0.01, 0.01]


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_resume_from_a_checkpoint_reproduces_the_next_steps(make_backend, tmp_path, stage):
    data = [[episode(1.0), episode(-0.5, tool=[99])], [episode(-1.0), episode(0.7)], [episode(0.3), episode(-0.3)]]
    backend = make_backend(zero_stage=stage)
    backend.train_step(data[0])
    backend.save_checkpoint(tmp_path / "ck", {"step": 1, "note": "after one"})
    expected = [backend.train_step(data[1])["loss"], backend.train_step(data[2])["loss"]]

    assert backend.load_checkpoint(tmp_path / "ck") == {"step": 1, "note": "after one"}
    assert backend.step == 1
    assert [backend.train_step(data[1])["loss"], backend.train_step(data[2])["loss"]] == expected

    fresh = make_backend(zero_stage=stage)  # a new process would do this
    fresh.load_checkpoint(tmp_path / "ck")
    assert [fresh.train_step(data[1])["loss"], fresh.train_step(data[2])["loss"]] == expected
    assert fresh.step == 3


@pytest.mark.parametrize("stage", [2, 3])
def test_exported_weights_load_with_transformers_and_equal_the_engine(make_backend, tmp_path, stage):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    backend = make_backend(zero_stage=stage)
    backend.train_step([episode(1.0), episode(-1.0)])
    path = backend.export_weights(tmp_path / "export")
    assert (path / "config.json").exists() and (path / "model.safetensors").exists()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    assert AutoTokenizer.from_pretrained(path).pad_token_id == backend.pad_id
    mine = all_params(backend)
    theirs = dict(model.named_parameters())
    assert set(mine) == set(theirs)
    for name, value in mine.items():
        assert torch.equal(theirs[name].detach().flatten(), value), name


def test_named_parameter_sample_returns_the_first_values_of_each_parameter(make_backend):
    backend = make_backend()
    backend.train_step([episode(1.0), episode(-1.0)])
    names = ["model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"]
    got = backend.named_parameter_sample(names, 5)
    params = dict(backend.module.named_parameters(remove_duplicate=False))
    assert {k: len(v) for k, v in got.items()} == dict.fromkeys(names, 5)
    for name in names:
        assert got[name] == params[name].detach().flatten()[:5].tolist()
    assert dict(backend.parameter_names())["model.norm.weight"] == (params["model.norm.weight"].numel(),)
    with pytest.raises(KeyError, match="no parameter named"):
        backend.named_parameter_sample(["nope"], 1)


def test_close_releases_the_process_group_and_restores_the_environment(make_backend):
    before = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "MASTER_PORT", "LOCAL_RANK")}
    backend = make_backend()
    assert torch.distributed.is_initialized()
    backend.close()
    assert not torch.distributed.is_initialized()
    assert {k: os.environ.get(k) for k in before} == before


# ---- the DeepSpeed config --------------------------------------------------------------------------

def test_deepspeed_config_fills_auto_values_from_the_training_config():
    ds = build_deepspeed_config(TrainingConfig(zero_stage=3, micro_batch_size=3, gradient_accumulation_steps=2,
                                               max_grad_norm=0.5, precision="bf16"))
    assert ds["zero_optimization"]["stage"] == 3
    assert (ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"], ds["gradient_clipping"]) == (3, 2, 0.5)
    assert ds["bf16"]["enabled"] is True and ds["fp16"]["enabled"] is False


def test_deepspeed_config_file_that_disagrees_with_the_training_config_is_refused(tmp_path):
    custom = tmp_path / "ds.json"
    custom.write_text(json.dumps({"zero_optimization": {"stage": 1}, "train_micro_batch_size_per_gpu": "auto"}))
    with pytest.raises(ConfigError, match="zero_optimization.stage=1 but training.zero_stage"):
        build_deepspeed_config(TrainingConfig(zero_stage=2, deepspeed_config=str(custom)))
    ok = build_deepspeed_config(TrainingConfig(zero_stage=1, deepspeed_config=str(custom)))
    assert ok["zero_optimization"]["stage"] == 1
    custom.write_text(json.dumps({"optimizer": {"type": "Adam"}}))
    with pytest.raises(ConfigError, match="optimizer section"):
        build_deepspeed_config(TrainingConfig(deepspeed_config=str(custom)))
    custom.write_text(json.dumps({"zero_optimization": {"reduce_bucket_size": "auto"}}))
    with pytest.raises(ConfigError, match="reduce_bucket_size"):
        build_deepspeed_config(TrainingConfig(deepspeed_config=str(custom)))


# ---- two ranks ----------------------------------------------------------------------------------

WORKER = str(Path(__file__).with_name("ds_worker.py"))  # a test-only trainer rank on synthetic samples

def test_two_ranks_under_torchrun_end_with_identical_parameters(model_dir, tmp_path):
    out = tmp_path / "ranks.json"
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "CUDA_VISIBLE_DEVICES": "", "DS_ACCELERATOR": "cpu",
           "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--nnodes", "1",
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
           WORKER, "--model", str(model_dir), "--steps", "2", "--out", str(out),
           "--zero-stage", "2"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    r0, r1 = report["ranks"]
    assert report["world_size"] == 2 and (r0["rank"], r1["rank"]) == (0, 1)
    assert r0["param_sha256"] == r1["param_sha256"] != r0["param_sha256_initial"]
    assert r0["optimizer_steps"] == r1["optimizer_steps"] == 2
    losses = [[m["loss"] for m in r["metrics"]] for r in (r0, r1)]
    assert all(math.isfinite(x) for x in losses[0] + losses[1])
    assert losses[0] != losses[1]  # each rank trained on its own shard


def test_two_ranks_lose_the_same_as_one_rank_on_the_same_data(model_dir, tmp_path):
    """ZeRO-2 over two gloo ranks, each on half the samples, against one rank on all of them: equal
    token counts per rank make the mean of the ranks' losses the one-rank loss, step by step."""
    from tests.integration.ds_worker import synthetic_samples

    out = tmp_path / "ranks.json"
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "CUDA_VISIBLE_DEVICES": "", "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--nnodes", "1", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), WORKER, "--model", str(model_dir), "--steps", "3",
           "--out", str(out), "--zero-stage", "2", "--samples-per-rank", "4", "--micro-batch-size", "4", "--length", "16"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0, r1 = json.loads(out.read_text())["ranks"]
    two = [(a["loss"] + b["loss"]) / 2 for a, b in zip(r0["metrics"], r1["metrics"])]

    one = DeepSpeedBackend(model_dir, TrainingConfig(zero_stage=2, micro_batch_size=8, learning_rate=1e-3))
    try:
        vocab = len(one.tokenizer)
        single = [one.train_step(synthetic_samples(0, s, 4, vocab, 0, 16) + synthetic_samples(1, s, 4, vocab, 0, 16))["loss"]
                  for s in range(3)]
    finally:
        one.close()
    assert single == pytest.approx(two, rel=1e-4, abs=1e-6)
    assert len(set(round(x, 6) for x in single)) > 1  # the model moved between steps


@pytest.fixture
def one_thread():
    """Sums in one order: how a GEMM splits its sums over threads moves a few near-zero gradients (and
    Adam's first step on them) past 1e-5 on some CPUs; that order is not what a test using this checks."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("stage", [0, 3])
def test_samples_sharing_a_prompt_train_as_the_whole_sequences_do(make_backend, monkeypatch, stage, one_thread):
    """A micro-batch whose samples share prompts computes each prompt once (`shared_prompts`); the
    step's loss, metrics and updated parameters are those of the whole-sequence computation."""
    from agentrl_cli.learner import shared_prompts

    other = [50, 51, 52, 53]
    samples = [episode(1.0), episode(-0.5, tool=[95]), Sample(other + COMPLETION[:3], [0] * 4 + [1] * 3, [-4.0] * 7, 0.8),
               Sample(other + COMPLETION[3:], [0] * 4 + [1] * 5, [-4.0] * 9, -0.8)]
    assert shared_prompts.split(collate(samples, 0), 0) is not None
    results = []
    for share in (True, False):
        if not share:
            monkeypatch.setattr(shared_prompts, "cache_argument", lambda model: None)
        backend = make_backend(zero_stage=stage, micro_batch_size=4)
        metrics = backend.train_step(samples)
        results.append((metrics, all_params(backend)))
    (shared, shared_params), (whole, whole_params) = results
    for key in ("loss", "grad_norm", "entropy", "mismatch_kl", "clip_fraction"):
        assert shared[key] == pytest.approx(whole[key], rel=1e-4, abs=1e-7), key
    assert shared["tokens"] == whole["tokens"] == 2 * len(COMPLETION) + 8
    # Adam's first step moves each weight by about the learning rate (1e-3); summing in another order
    # moves the updates of a few near-zero gradients by a few 1e-6
    for name, value in whole_params.items():
        assert torch.allclose(shared_params[name], value, atol=1e-5), name


def test_deepspeed_is_imported_without_its_autotuners_mlflow_which_a_tracker_still_imports():
    """DeepSpeed's autotuner imports mlflow (and pandas) when it is installed, for autotuning agentrl
    never runs; import_deepspeed keeps it out of every rank's start-up, and mlflow imports afterwards."""
    pytest.importorskip("mlflow")
    code = ("import sys\nfrom agentrl_cli.learner.deepspeed_backend import import_deepspeed\nimport_deepspeed()\n"
            "import deepspeed.autotuning.autotuner as tuner\nloaded = 'mlflow' in sys.modules\nimport mlflow\n"
            "print(tuner.has_mlflow, loaded, mlflow.__name__)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.split() == ["False", "False", "mlflow"], done.stderr[-2000:]
