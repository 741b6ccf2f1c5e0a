"""LoRA on the trainer (`training.lora`, learner/lora.py): real peft under the DeepSpeed backend,
single rank on gloo, on a random model with the built-in model's shapes. Only the adapter trains;
the adapter export is peft's layout and small; the merged export is an ordinary model with the
trainer's log-probs; the weight-sync views keep the ordinary names with merged values; a checkpoint
resumes adapter and optimizer exactly; `agentrl model export` writes both kinds from a run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from agentrl_cli.config.models import LoraConfig, PlatformConfig, TrainingConfig
from agentrl_cli.core.errors import ConfigError
from agentrl_cli.learner import grpo, lora, shared_prompts
from agentrl_cli.learner.checkpoint import CheckpointManager
from agentrl_cli.learner.deepspeed_backend import DeepSpeedBackend
from agentrl_cli.learner.grpo import Sample, collate, token_logprobs
from agentrl_cli.weightsync.publisher import VERIFY_NAMES

PROMPT = [60, 61, 62, 63, 64, 65]


def samples() -> list[Sample]:
    """Two answers to one prompt (a GRPO group: the shared-prompt path) with opposite advantages."""
    out = []
    for answer, advantage in (([70, 71, 72, 73, 74, 75, 76, 77], 1.0), ([80, 81, 82, 83, 84, 85], -1.0)):
        ids = PROMPT + answer
        out.append(Sample(ids, [0] * len(PROMPT) + [1] * len(answer), [-5.5] * len(ids), advantage))
    return out


class Backends:
    """Builds DeepSpeed backends with LoRA on the random model, one alive at a time (one process group
    per process); `shared(key)` hands back the live one when it was built under the same key."""

    def __init__(self, model_dir: Path) -> None:
        self.model_dir, self.live, self.key = model_dir, None, None

    def __call__(self, key: str | None = None, **overrides) -> DeepSpeedBackend:
        self.close()
        cfg = {"micro_batch_size": 2, "learning_rate": 1e-2, "zero_stage": 2, "lora": LoraConfig(), **overrides}
        self.live, self.key = DeepSpeedBackend(self.model_dir, TrainingConfig(**cfg)), key
        return self.live

    def shared(self, key: str, setup, **overrides) -> DeepSpeedBackend:
        if self.key != key or self.live is None:
            setup(self(key, **overrides))
        return self.live

    def close(self) -> None:
        if self.live is not None:
            self.live.close()
        self.live = self.key = None


@pytest.fixture(scope="module")
def make(random_model_dir):
    backends = Backends(random_model_dir)
    yield backends
    backends.close()


@pytest.fixture
def trained(make):
    """A LoRA backend with a KL reference, after 3 steps (its first and last metrics in `.metrics`)."""
    def setup(backend):
        backend.metrics = [backend.train_step(samples()) for _ in range(3)]
    return make.shared("trained", setup, kl_coef=0.1)


def logprobs(model, batch) -> torch.Tensor:
    with torch.no_grad():
        lp, _ = token_logprobs(model, batch)
    return lp * batch.loss_mask


def adapter_tensors(backend) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in lora.adapter_parameters(backend.module)}


def optimizer_state(backend) -> list[torch.Tensor]:
    """AdamW's state tensors (ZeRO-2 keeps them for its flat fp32 partition of the trained parameters)."""
    opt = getattr(backend.engine.optimizer, "optimizer", backend.engine.optimizer)
    return [v.detach().clone() for state in opt.state.values() for v in state.values() if torch.is_tensor(v)]


def test_only_the_adapter_trains_and_only_it_reaches_the_optimizer(make):
    backend = make(zero_stage=0)  # no ZeRO: the engine's optimizer is the AdamW given to it
    adapters = adapter_tensors(backend)
    frozen = {n: p.detach().clone() for n, p in backend.module.named_parameters() if id(p) not in
              {id(q) for _, q in lora.adapter_parameters(backend.module)}}
    assert len(adapters) == 2 * 4 * 3  # A and B of the 4 default projections in 3 layers
    assert all(not p.requires_grad for n, p in backend.module.named_parameters() if n in frozen)
    optimized = {id(p) for group in backend.engine.optimizer.param_groups for p in group["params"]}
    assert optimized == {id(p) for _, p in lora.adapter_parameters(backend.module)}
    after = dict(backend.module.named_parameters())
    backend.train_step(samples())
    changed = {n for n, v in adapters.items() if not torch.equal(after[n], v)}
    assert changed == {n for n in adapters if ".lora_B." in n}  # B starts at zero, so A's gradient is zero at first
    backend.train_step(samples())
    assert all(not torch.equal(after[n], v) for n, v in adapters.items())
    assert all(torch.equal(after[n], v) for n, v in frozen.items())


def test_a_target_module_that_matches_nothing_is_a_config_error_naming_the_models_layers(random_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(random_model_dir)
    with pytest.raises(ConfigError) as err:
        lora.wrap(model, LoraConfig(target_modules=["q_proj", "query_key_value"]))
    assert "query_key_value" in err.value.message and "q_proj" not in err.value.message
    assert "training.lora.target_modules" in err.value.hint and "gate_proj" in err.value.hint
    with pytest.raises(ConfigError) as err:  # a block, not a layer peft can adapt
        lora.wrap(AutoModelForCausalLM.from_pretrained(random_model_dir), LoraConfig(target_modules=["self_attn"]))
    assert "self_attn" in err.value.message and "o_proj" in err.value.hint


def test_target_modules_take_effect_and_the_mlp_projections_are_adapted_when_named(make, tmp_path):
    backend = make(lora=LoraConfig(target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    adapter = backend.export_adapter(tmp_path / "adapter") / "adapter_model.safetensors"
    assert len(load_file(adapter)) == 2 * 7 * 3
    assert any(".mlp.down_proj.lora_A." in k for k in load_file(adapter))


def test_the_adapter_export_is_peft_layout_and_holds_only_the_adapter(trained, tmp_path, capsys):
    adapter = trained.export_adapter(tmp_path / "adapter")
    full = trained.export_weights(tmp_path / "full")
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["peft_type"]) == (8, 16.0, "LORA")
    assert sorted(config["target_modules"]) == sorted(LoraConfig().target_modules)
    tensors = load_file(adapter / "adapter_model.safetensors")
    assert len(tensors) == 2 * 4 * 3 and all(".lora_A." in k or ".lora_B." in k for k in tensors)
    lora_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
    adapter_bytes = (adapter / "adapter_model.safetensors").stat().st_size
    full_bytes = (full / "model.safetensors").stat().st_size
    assert lora_bytes <= adapter_bytes < lora_bytes + 16_384  # the tensors and a header, nothing else
    assert adapter_bytes < 0.05 * full_bytes  # the adapter sync payload against a full sync
    with capsys.disabled():
        print(f"\nLoRA r=8 on the 4 default projections of the built-in model's shapes: adapter {adapter_bytes:,} bytes, "
              f"full sync {full_bytes:,} bytes ({100 * adapter_bytes / full_bytes:.2f}%)")


def test_the_merged_export_is_a_plain_model_with_the_trainers_logprobs(trained, random_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    out = trained.export_weights(tmp_path / "merged")
    assert not [k for k in load_file(out / "model.safetensors") if "lora" in k or "base_layer" in k]
    merged = AutoModelForCausalLM.from_pretrained(out).eval()
    base = AutoModelForCausalLM.from_pretrained(random_model_dir).eval()
    batch = collate(samples(), trained.pad_id)
    trained.engine.eval()
    trainer = logprobs(trained.module, batch)
    assert (logprobs(merged, batch) - trainer).abs().max() < 1e-4
    assert (logprobs(base, batch) - trainer).abs().max() > 1e-3  # the adapter did change the policy
    layers = lora.lora_layers(trained.module)  # the training model kept its adapter: nothing merged in place
    assert len(layers) == 4 * 3 and not any(layer.merged for layer in layers.values())


def test_weight_sync_views_keep_the_ordinary_names_with_merged_values(trained, random_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(random_model_dir)
    assert trained.parameter_names() == [(n, tuple(p.shape)) for n, p in base.named_parameters(remove_duplicate=False)]
    merged = load_file(trained.export_weights(tmp_path / "merged") / "model.safetensors")
    tensors = trained.named_tensors()
    assert list(tensors) == [n for n, _ in base.named_parameters()]
    assert all(torch.equal(tensors[n], merged[n]) for n in merged)
    sample = trained.named_parameter_sample(list(VERIFY_NAMES), 16)
    for name in VERIFY_NAMES:
        stored = merged.get(name, merged.get("model.embed_tokens.weight"))  # lm_head is tied
        assert sample[name] == stored.flatten()[:16].tolist()
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(tensors[q], dict(base.named_parameters())[q])  # merged, not the base weight


def test_the_forward_keeps_its_cache_and_logits_to_keep_through_peft(trained):
    assert shared_prompts.cache_argument(trained.engine) is not None
    assert shared_prompts.cache_argument(trained.reference) is not None
    batch = collate(samples(), trained.pad_id)
    assert grpo._kept_positions(trained.engine, batch) is not None  # logits only where the loss needs them
    split = shared_prompts.split(batch, trained.pad_id)
    assert split is not None
    trained.engine.eval()
    with torch.no_grad():
        shared, _ = shared_prompts.token_logprobs(trained.engine, batch, split)
        whole, _ = token_logprobs(trained.engine, batch)
    assert (shared * batch.loss_mask - whole * batch.loss_mask).abs().max() < 1e-5


def test_the_kl_reference_is_the_base_model_with_the_adapter_switched_off(trained, random_model_dir):
    from transformers import AutoModelForCausalLM

    first, *_, last = trained.metrics
    assert first["kl_ref"] == pytest.approx(0.0, abs=1e-6)  # the adapter starts as a no-op
    assert last["kl_ref"] > 1e-4  # and the penalty sees the policy move away
    batch = collate(samples(), trained.pad_id)
    trained.engine.eval()
    base = AutoModelForCausalLM.from_pretrained(random_model_dir).eval()
    reference = logprobs(trained.reference, batch)
    assert (reference - logprobs(base, batch)).abs().max() < 1e-5
    assert (reference - logprobs(trained.module, batch)).abs().max() > 1e-3


@pytest.fixture(scope="module")
def checkpointed(make, tmp_path_factory):
    """A LoRA run's state after 2 steps: a checkpoint in a run directory's stage8 loop, what the
    backend held when it was saved, the third step's loss, and both exports of those weights."""
    backend = make("checkpointed")
    for _ in range(2):
        backend.train_step(samples())
    tmp = tmp_path_factory.mktemp("lora-run")
    run = tmp / "runs" / "r1"
    run.mkdir(parents=True)
    archived = PlatformConfig.model_validate({"training": backend.config.model_dump()}).model_dump(mode="json")
    (run / "meta.json").write_text(json.dumps({"run_id": "r1", "config": archived}))  # as rundir.create_run archives it
    ckpt = CheckpointManager(run / "stage8" / "checkpoints").save(
        2, lambda d: backend.save_checkpoint(d / "engine", {"step": 2, "version": 2}), {"run_id": "r1"})
    state = {"adapter": adapter_tensors(backend), "optimizer": optimizer_state(backend),
             "merged": load_file(backend.export_weights(tmp / "merged") / "model.safetensors"),
             "adapter_file": load_file(backend.export_adapter(tmp / "adapter") / "adapter_model.safetensors")}
    state["third_loss"] = backend.train_step(samples())["loss"]
    state["third_adapter"] = adapter_tensors(backend)
    make.close()
    return run, ckpt, state


def test_a_checkpoint_resumes_adapter_and_optimizer_exactly(make, checkpointed):
    _, ckpt, saved = checkpointed
    module_file = torch.load(ckpt / "engine" / "ckpt" / "mp_rank_00_model_states.pt", weights_only=False)["module"]
    adapter_names = set(saved["adapter"])
    assert adapter_names <= set(module_file)
    assert set(module_file) - adapter_names <= {"lm_head.weight"}  # DeepSpeed keeps a tied frozen weight's second name
    backend = make()
    state = backend.load_checkpoint(ckpt / "engine")
    assert state == {"step": 2, "version": 2} and backend.step == 2
    restored = adapter_tensors(backend)
    assert all(torch.equal(restored[n], v) for n, v in saved["adapter"].items())
    assert [torch.equal(a, b) for a, b in zip(optimizer_state(backend), saved["optimizer"])] == [True] * len(saved["optimizer"])
    assert backend.train_step(samples())["loss"] == pytest.approx(saved["third_loss"], abs=1e-6)
    third = adapter_tensors(backend)
    assert all(torch.allclose(third[n], v, atol=1e-6) for n, v in saved["third_adapter"].items())


def test_a_checkpoint_of_other_lora_settings_is_refused(make, checkpointed):
    _, ckpt, _ = checkpointed
    backend = make(lora=LoraConfig(rank=4))
    with pytest.raises(ConfigError) as err:
        backend.load_checkpoint(ckpt / "engine")
    assert "'rank': 8" in err.value.message and "'rank': 4" in err.value.message


def test_model_export_writes_the_merged_model_and_the_adapter_of_a_runs_checkpoint(cli, make, checkpointed, tmp_path):
    run, ckpt, saved = checkpointed
    make.close()  # the command builds its own trainer
    runs = ["--set", f"observe.runs_dir={run.parent}"]
    merged, body = cli.json("model", "export", "r1", "--merge", *runs)
    assert merged.exit_code == 0, merged.stderr
    assert (body["kind"], body["step"], body["checkpoint"]) == ("merged", 2, str(ckpt))
    out = Path(body["out"])
    assert out == run / "stage8" / "exports" / "step-00000002-merged"
    written = load_file(out / "model.safetensors")
    assert written.keys() == saved["merged"].keys()
    assert all(torch.equal(written[k], v) for k, v in saved["merged"].items())
    adapter, body = cli.json("model", "export", str(run), "--out", str(tmp_path / "a"), *runs)
    assert adapter.exit_code == 0 and body["kind"] == "adapter"
    tensors = load_file(tmp_path / "a" / "adapter_model.safetensors")
    assert all(torch.equal(tensors[k], v) for k, v in saved["adapter_file"].items())
    again = cli("model", "export", "r1", "--out", str(tmp_path / "a"), *runs)
    assert again.exit_code == 2 and "not empty" in again.stderr
    other = cli("model", "export", "r1", "--step", "7", *runs)
    assert other.exit_code == 2 and "step 7" in other.stderr and "stage8/step-00000002" in other.stderr


def test_model_export_of_a_missing_run_or_step_exits_2_with_a_hint(cli, tmp_path):
    (tmp_path / "runs" / "empty").mkdir(parents=True)
    (tmp_path / "runs" / "empty" / "meta.json").write_text("{}")
    sets = ["--set", f"observe.runs_dir={tmp_path / 'runs'}"]
    missing = cli("model", "export", "nope", *sets)
    assert missing.exit_code == 2 and "no run 'nope'" in missing.stderr and "agentrl runs list" in missing.stderr
    empty = cli("model", "export", "empty", "--merge", *sets)
    assert empty.exit_code == 2 and "no complete checkpoint" in empty.stderr and "checkpoint_interval_steps" in empty.stderr


def test_model_export_of_a_full_fine_tuning_run_writes_the_full_weights_and_says_merge_is_moot(cli, make, tmp_path):
    backend = make(lora=None)
    backend.train_step(samples())
    run = tmp_path / "runs" / "full"
    ckpt = CheckpointManager(run / "checkpoints").save(1, lambda d: backend.save_checkpoint(d / "engine", {}), {})
    expected = load_file(backend.export_weights(tmp_path / "expected") / "model.safetensors")
    make.close()
    result, body = cli.json("model", "export", str(run), "--merge", "--out", str(tmp_path / "out"))
    assert result.exit_code == 0, result.stderr
    assert (body["kind"], body["checkpoint"], body["lora"]) == ("full", str(ckpt), None)
    assert "--merge changes nothing" in body["note"]
    written = load_file(tmp_path / "out" / "model.safetensors")
    assert written.keys() == expected.keys() and all(torch.equal(written[k], v) for k, v in expected.items())


class _NoAdapterBackend:
    """A plugin backend that knows nothing of adapters."""

    def __init__(self, model_path, training_config) -> None:
        raise AssertionError("never built: the LoRA check comes first")


def test_a_backend_without_export_adapter_is_refused_when_training_lora_is_set(tmp_path):
    from agentrl_cli.config.models import PlatformConfig
    from agentrl_cli.learner.backends import make_backend

    cfg = PlatformConfig.model_validate({"training": {"backend": f"{__name__}:_NoAdapterBackend", "lora": {}}})
    with pytest.raises(ConfigError) as err:
        make_backend(tmp_path, cfg, tmp_path)
    assert "_NoAdapterBackend" in err.value.message and "training.lora" in err.value.hint
