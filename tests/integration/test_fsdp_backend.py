"""The FSDP2 backend (`training.backend: fsdp`) on a random tiny model, on CPU with gloo: the same
per-step losses as DeepSpeed ZeRO-0 on the same data on one rank and on two, a checkpoint that
resumes exactly, a DeepSpeed checkpoint refused by name, and exported weights that are the trained
ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agentrl_cli.config.models import LoraConfig, TrainingConfig
from agentrl_cli.core.errors import ConfigError
from agentrl_cli.learner.backend import TrainingBackend, backend_class
from tests.conftest import free_port
from tests.integration.ds_worker import synthetic_samples

pytestmark = pytest.mark.integration

WORKER = str(Path(__file__).with_name("ds_worker.py"))
STEPS = 3


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from agentrl_cli.model.tiny import build_random

    return build_random(tmp_path_factory.mktemp("fsdp") / "tiny", seed=3)


def backend(model_dir, name: str, **overrides):
    cfg = TrainingConfig(**{"backend": name, "zero_stage": 0, "micro_batch_size": 4, "learning_rate": 1e-3, **overrides})
    return backend_class(cfg)(model_dir, cfg)


def steps(b, first: int = 0, count: int = STEPS) -> list[dict]:
    vocab = len(b.tokenizer)
    return [b.train_step(synthetic_samples(0, s, 8, vocab)) for s in range(first, first + count)]


def test_fsdp_loses_as_deepspeed_zero0_does_on_one_rank(model_dir):
    runs = {}
    for name in ("deepspeed", "fsdp"):
        b = backend(model_dir, name)
        try:
            assert isinstance(b, TrainingBackend)
            runs[name] = steps(b)
            assert b.step == STEPS
        finally:
            b.close()
    for key in ("loss", "grad_norm", "entropy", "mismatch_kl", "clip_fraction", "approx_kl"):
        assert [m[key] for m in runs["fsdp"]] == pytest.approx([m[key] for m in runs["deepspeed"]], rel=1e-4, abs=1e-7), key
    assert [m["tokens"] for m in runs["fsdp"]] == [m["tokens"] for m in runs["deepspeed"]]
    assert len({round(m["loss"], 6) for m in runs["fsdp"]}) == STEPS  # the model moved between steps


def _two_ranks(model_dir, out: Path, name: str) -> list[float]:
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "CUDA_VISIBLE_DEVICES": "", "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--nnodes", "1", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), WORKER, "--model", str(model_dir), "--steps", str(STEPS), "--out", str(out),
           "--zero-stage", "0", "--samples-per-rank", "4", "--micro-batch-size", "2", "--backend", name]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    r0, r1 = report["ranks"]
    assert report["backend"] == name and r0["optimizer_steps"] == r1["optimizer_steps"] == STEPS
    assert r0["param_sha256"] == r1["param_sha256"] != r0["param_sha256_initial"]  # gradients were averaged
    return [(a["loss"] + b["loss"]) / 2 for a, b in zip(r0["metrics"], r1["metrics"])]


def test_fsdp_loses_as_deepspeed_zero0_does_on_two_ranks(model_dir, tmp_path):
    deepspeed = _two_ranks(model_dir, tmp_path / "deepspeed.json", "deepspeed")
    fsdp = _two_ranks(model_dir, tmp_path / "fsdp.json", "fsdp")
    assert fsdp == pytest.approx(deepspeed, rel=1e-4, abs=1e-7)
    assert len({round(x, 6) for x in fsdp}) == STEPS


def test_an_fsdp_checkpoint_resumes_under_fsdp_and_a_deepspeed_one_is_refused(model_dir, tmp_path):
    b = backend(model_dir, "fsdp")
    try:
        steps(b, 0, 1)
        b.save_checkpoint(tmp_path / "fsdp", {"step": 1, "note": "mine"})
        expected = [m["loss"] for m in steps(b, 1, 2)]
    finally:
        b.close()
    resumed = backend(model_dir, "fsdp")
    try:
        assert resumed.load_checkpoint(tmp_path / "fsdp") == {"step": 1, "note": "mine"}
        assert resumed.step == 1
        assert [m["loss"] for m in steps(resumed, 1, 2)] == pytest.approx(expected, rel=1e-6)
    finally:
        resumed.close()
    ds = backend(model_dir, "deepspeed")
    try:
        ds.save_checkpoint(tmp_path / "ds", {"step": 0})
    finally:
        ds.close()
    fresh = backend(model_dir, "fsdp")
    try:
        with pytest.raises(ConfigError, match="training.backend='deepspeed'"):
            fresh.load_checkpoint(tmp_path / "ds")
    finally:
        fresh.close()


def test_fsdp_exports_the_trained_weights(model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    b = backend(model_dir, "fsdp")
    try:
        steps(b, 0, 1)
        tensors = b.named_tensors()
        sample = b.named_parameter_sample(["model.embed_tokens.weight", "lm_head.weight"], 5)
        out = b.export_weights(tmp_path / "export")
    finally:
        b.close()
    loaded = dict(AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).named_parameters())
    assert set(tensors) <= set(loaded)
    for name, value in tensors.items():
        assert torch.equal(loaded[name].detach(), value), name
    assert sample["lm_head.weight"] == sample["model.embed_tokens.weight"]  # tied, read under each name
    initial = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    assert not torch.equal(initial.model.embed_tokens.weight, tensors["model.embed_tokens.weight"])


def test_fsdp_trains_and_exports_a_lora_adapter(model_dir, tmp_path):
    b = backend(model_dir, "fsdp", lora=LoraConfig(rank=4, alpha=8.0))
    try:
        trainable = {n for n, p in b.module.named_parameters() if p.requires_grad}
        assert trainable and all("lora_" in n for n in trainable)
        metrics = steps(b, 0, 2)
        assert all(torch.isfinite(torch.tensor(m["loss"])) for m in metrics)
        adapter = b.export_adapter(tmp_path / "adapter")
        b.save_checkpoint(tmp_path / "ckpt", {"step": 2})
        adapted = [n for n, _ in b.parameter_names() if n.endswith("q_proj.weight")]
        trained = b.named_parameter_sample(adapted, 64)
        expected = [m["loss"] for m in steps(b, 2, 2)]
    finally:
        b.close()
    assert (adapter / "adapter_config.json").is_file() and (adapter / "adapter_model.safetensors").is_file()
    again = backend(model_dir, "fsdp", lora=LoraConfig(rank=4, alpha=8.0))
    try:
        assert again.named_parameter_sample(adapted, 64) != trained  # a fresh adapter merges to the base weights
        assert again.load_checkpoint(tmp_path / "ckpt") == {"step": 2}
        assert again.named_parameter_sample(adapted, 64) == trained  # the adapter came back
        # the second loss follows an update made with the restored optimizer state
        assert [m["loss"] for m in steps(again, 2, 2)] == pytest.approx(expected, rel=1e-6)
    finally:
        again.close()
