"""LoRA on the embedded server over HTTP, and the adapter weight-sync transport against it: SGLang's
load/unload shapes; a request naming an adapter decoded exactly as peft's base + adapter, the base
untouched, prompts of several adapters in one request each by its own; the prefix cache never
reused across adapters; unknown and refused adapters; adapters kept across a full weight update;
then the transport publishing versions (old adapter unloaded, clients switched, log-probs equal to
the trainer's merged model), its verification failing on the wrong base, the re-sync of a restarted
server, the full-sync fallback when a server refuses, and the payload measured against a full sync.

The trainer is peft itself (`PeftTrainer`: the adapter layout and merged values the DeepSpeed
backend's `export_adapter` / `named_parameter_sample` give), so these tests need no optimizer."""

from __future__ import annotations

import asyncio
import copy
import json
import shutil
from collections import Counter
from pathlib import Path

import httpx
import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM

from agentrl_cli.config.models import LORA_TARGETS_DEFAULT
from agentrl_cli.engines.inference import HFEngine, create_app
from agentrl_cli.engines.inference.client import InferenceClient, SamplingParams
from agentrl_cli.model.tiny import build_random
from agentrl_cli.core.serving import ServerThread
from agentrl_cli.weightsync.base import WeightSyncError
from agentrl_cli.weightsync.lora import LoraTransport
from agentrl_cli.weightsync.publisher import WeightPublisher

pytestmark = pytest.mark.integration

PROMPT = [72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100, 33, 10, 40, 50, 60, 70, 80, 90, 100]  # 20 tokens


def load(path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


def write_adapter(model_dir: Path, out: Path, seed: int, rank: int = 8) -> Path:
    """A real peft adapter for `model_dir`: LoRA on the default targets, B (zero at init) set at random."""
    model = get_peft_model(load(model_dir), LoraConfig(r=rank, lora_alpha=16, target_modules=list(LORA_TARGETS_DEFAULT)))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    model.save_pretrained(out)
    return out


def forward_logprobs(model, tokens: list[int]) -> torch.Tensor:
    """log p(token i | tokens before it) for i >= 1."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([tokens])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(tokens[1:])[:, None]).squeeze(1)


def served_logprobs(answer: dict) -> tuple[list[int], torch.Tensor]:
    """(prompt + output ids, log-probs of every token after the first) of a logprob_start_len=0 answer."""
    meta = answer["meta_info"]
    ins, outs = meta["input_token_logprobs"], meta["output_token_logprobs"]
    tokens = [t for _, t, _ in ins] + [t for _, t, _ in outs]
    return tokens, torch.tensor([lp for lp, _, _ in ins[1:]] + [lp for lp, _, _ in outs])


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    model, other = build_random(root / "m", seed=7), build_random(root / "m2", seed=8)
    narrow = build_random(root / "narrow", seed=9, hidden_size=64, intermediate_size=192)
    found = {"model": model, "other": other, "a1": write_adapter(model, root / "a1", seed=1),
             "a2": write_adapter(model, root / "a2", seed=2),
             "narrow_adapter": write_adapter(narrow, root / "narrow_adapter", seed=3)}
    targets = shutil.copytree(found["a1"], root / "other_targets")  # modules the model does not have
    config = json.loads((targets / "adapter_config.json").read_text())
    (targets / "adapter_config.json").write_text(json.dumps({**config, "target_modules": ["c_attn", "c_proj"]}))
    found["other_targets"] = targets
    return found


@pytest.fixture(scope="module")
def peft_models(files):
    """base + adapter as peft computes it, per adapter, and the plain base."""
    return {"base": load(files["model"]), **{k: PeftModel.from_pretrained(load(files["model"]), str(files[k])).eval()
                                             for k in ("a1", "a2")}}


class Served:
    def __init__(self, model_dir, prefix_cache_tokens: int = 0) -> None:
        self.engine = HFEngine(model_dir, weight_version="0", prefix_cache_tokens=prefix_cache_tokens)
        self.server = ServerThread(create_app(self.engine), name="hf server").start()
        self.url = self.server.url

    def post(self, path, body):
        return httpx.post(f"{self.url}{path}", json=body, timeout=120)

    def generate(self, input_ids, lora_path=None, max_new_tokens=6):
        body = {"input_ids": input_ids, "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new_tokens},
                "return_logprob": True, "logprob_start_len": 0}
        if lora_path is not None:
            body["lora_path"] = lora_path
        response = self.post("/generate", body)
        assert response.status_code == 200, response.text
        return response.json()

    def close(self) -> None:
        self.server.stop()
        self.engine.close()


@pytest.fixture(scope="module")
def served(files):
    s = Served(files["model"], prefix_cache_tokens=4096)
    yield s
    s.close()


def test_load_and_unload_answer_in_sglangs_shapes(served, files):
    a1 = str(files["a1"])
    r = served.post("/load_lora_adapter", {"lora_name": "shapes", "lora_path": a1})
    assert r.status_code == 200 and r.json() == {"success": True, "error_message": "", "loaded_adapters": {"shapes": a1}}
    info = httpx.get(f"{served.url}/get_server_info").json()
    assert info["loaded_lora_adapters"] == {"shapes": a1} and info["enable_lora"] is True
    again = served.post("/load_lora_adapter", {"lora_name": "shapes", "lora_path": str(files["a2"])})
    assert again.status_code == 400
    assert again.json() == {"success": False, "error_message": "Failed to load LoRA adapter shapes because it is "
                            "already loaded", "loaded_adapters": {"shapes": a1}}
    r = served.post("/unload_lora_adapter", {"lora_name": "shapes"})
    assert r.status_code == 200 and r.json() == {"success": True, "error_message": "", "loaded_adapters": {}}
    gone = served.post("/unload_lora_adapter", {"lora_name": "shapes"})
    assert gone.status_code == 400 and not gone.json()["success"]
    assert "LoRA with name shapes does not exist" in gone.json()["error_message"]
    missing = served.post("/load_lora_adapter", {"lora_name": "x"})
    assert missing.status_code == 400 and "lora_path: required field missing" in missing.json()["error"]["message"]


def test_requests_are_decoded_by_their_adapter_exactly_as_peft_and_without_one_by_the_base(served, files, peft_models):
    for name in ("a1", "a2"):
        assert served.post("/load_lora_adapter", {"lora_name": name, "lora_path": str(files[name])}).status_code == 200
    try:
        answers = {name: served.generate(PROMPT, name) for name in ("a1", "a2")}
        answers["base"] = served.generate(PROMPT)
        for name, answer in answers.items():
            tokens, ours = served_logprobs(answer)
            theirs = forward_logprobs(peft_models[name], tokens)
            assert torch.allclose(ours, theirs, atol=1e-4), (name, (ours - theirs).abs().max())
        _, base = served_logprobs(answers["base"])
        _, adapted = served_logprobs(answers["a1"])
        assert (base[:len(PROMPT) - 1] - adapted[:len(PROMPT) - 1]).abs().max() > 0.05  # the adapter changes the model
        # one request, three prompts, each with its own weights: as each asked alone
        body = {"input_ids": [PROMPT] * 3, "lora_path": ["a2", None, "a1"], "return_logprob": True,
                "logprob_start_len": 0, "sampling_params": {"temperature": 0.0, "max_new_tokens": 6}}
        batch = served.post("/generate", body).json()
        for got, name in zip(batch, ("a2", "base", "a1")):
            assert got["output_ids"] == answers[name]["output_ids"], name
            assert torch.allclose(served_logprobs(got)[1], served_logprobs(answers[name])[1], atol=1e-5), name
    finally:
        for name in ("a1", "a2"):
            served.post("/unload_lora_adapter", {"lora_name": name})


def test_the_prefix_cache_is_never_reused_across_adapters(served, files, peft_models):
    served.post("/load_lora_adapter", {"lora_name": "cached", "lora_path": str(files["a1"])})
    try:
        first = served.generate(PROMPT)  # the base's KV of PROMPT stays in the base's cache
        longer = PROMPT + first["output_ids"] + [44, 45]
        adapted = served.generate(longer, "cached", max_new_tokens=3)
        assert adapted["meta_info"]["cached_tokens"] == 0
        tokens, ours = served_logprobs(adapted)
        assert torch.allclose(ours, forward_logprobs(peft_models["a1"], tokens), atol=1e-4)
        body = {"input_ids": longer + [46], "lora_path": "cached", "return_logprob": True,  # output log-probs only
                "sampling_params": {"temperature": 0.0, "max_new_tokens": 2}}
        again = served.post("/generate", body).json()
        assert again["meta_info"]["cached_tokens"] > 0  # the adapter's own cache is used
        theirs = forward_logprobs(peft_models["a1"], longer + [46] + again["output_ids"])[-2:]
        assert torch.allclose(torch.tensor([lp for lp, _, _ in again["meta_info"]["output_token_logprobs"]]), theirs,
                              atol=1e-4)
    finally:
        served.post("/unload_lora_adapter", {"lora_name": "cached"})


@pytest.mark.parametrize("key, fragment", [
    ("missing", "is not a directory"),
    ("other_targets", "does not fit the model"),
    ("narrow_adapter", "size mismatch"),
])
def test_an_adapter_that_does_not_fit_is_refused_and_nothing_changes(served, files, key, fragment):
    served.post("/load_lora_adapter", {"lora_name": "good", "lora_path": str(files["a1"])})
    try:
        before = served.generate(PROMPT, "good")
        path = str(files.get(key, files["a1"].parent / "no-such-adapter"))
        r = served.post("/load_lora_adapter", {"lora_name": "bad", "lora_path": path})
        assert r.status_code == 400 and not r.json()["success"]
        assert fragment in r.json()["error_message"] and "Failed to load LoRA adapter bad" in r.json()["error_message"]
        assert r.json()["loaded_adapters"] == {"good": str(files["a1"])}
        assert served.generate(PROMPT, "good")["output_ids"] == before["output_ids"]
        unknown = served.post("/generate", {"input_ids": PROMPT, "lora_path": "bad"})
        assert unknown.status_code == 400
        message = unknown.json()["error"]["message"]
        assert "The following requested LoRA adapters are not loaded: bad" in message and "'good'" in message
    finally:
        served.post("/unload_lora_adapter", {"lora_name": "good"})


def test_a_full_weight_update_keeps_the_adapter_merged_onto_the_new_base(files):
    s = Served(files["model"])
    try:
        s.post("/load_lora_adapter", {"lora_name": "kept", "lora_path": str(files["a1"])})
        r = s.post("/update_weights_from_disk", {"model_path": str(files["other"]), "weight_version": "5"})
        assert r.status_code == 200 and r.json()["success"], r.text
        answer = s.generate(PROMPT, "kept")
        assert answer["meta_info"]["weight_version"] == "5"
        tokens, ours = served_logprobs(answer)
        on_new_base = PeftModel.from_pretrained(load(files["other"]), str(files["a1"])).eval()
        assert torch.allclose(ours, forward_logprobs(on_new_base, tokens), atol=1e-4)
    finally:
        s.close()


# ---- the adapter transport ----------------------------------------------------------------------


class PeftTrainer:
    """The trainer's side of LoRA weight sync, by peft: the adapter directory (`export_adapter`), the
    merged model directory (`export_weights`) and merged parameter values (`named_parameter_sample`)."""

    rank = 0

    def __init__(self, model_dir: Path, rank: int = 8) -> None:
        config = LoraConfig(r=rank, lora_alpha=16, target_modules=list(LORA_TARGETS_DEFAULT))
        self.model = get_peft_model(load(model_dir), config)

    def perturb(self, seed: int) -> None:
        """Change the adapter as a train step would (B leaves zero, so the policy leaves the base)."""
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                if "lora_" in name:
                    p.add_(torch.randn(p.shape, generator=gen) * 0.03)

    def merged(self):
        return copy.deepcopy(self.model).merge_and_unload().eval()

    def export_adapter(self, path: Path) -> Path:
        self.model.save_pretrained(path)
        return path

    def export_weights(self, path: Path) -> Path:
        self.merged().save_pretrained(path)
        return path

    def parameter_names(self):
        return [(n, tuple(p.shape)) for n, p in self.merged().named_parameters(remove_duplicate=False)]

    def named_parameter_sample(self, names, n):
        params = dict(self.merged().named_parameters(remove_duplicate=False))
        return {name: params[name].detach().flatten()[:n].tolist() for name in names}


def run(client: InferenceClient, coro):
    """`coro` on an event loop of its own, closing the client's connections on it."""
    async def main():
        try:
            return await coro
        finally:
            await client.close()
    return asyncio.run(main())


async def policy_logprobs(client: InferenceClient, trainer: PeftTrainer) -> tuple[torch.Tensor, torch.Tensor, str]:
    """(served, trainer's merged model) log-probs of a greedy generation through the client, and its version."""
    gen = await client.generate(PROMPT, SamplingParams(max_new_tokens=6, temperature=0.0))
    theirs = forward_logprobs(trainer.merged(), PROMPT + gen.output_ids)[-len(gen.output_ids):]
    return torch.tensor(gen.output_logprobs), theirs, gen.weight_version


@pytest.fixture
def sync(files, tmp_path):
    """A fresh server, a client, a trainer and a publisher over the adapter transport."""
    s = Served(files["model"])
    client = InferenceClient([s.url])
    trainer = PeftTrainer(files["model"])
    counters: Counter = Counter()
    transport = LoraTransport(client, tmp_path / "run", base_path=files["model"])
    publisher = WeightPublisher(transport, client, launch_path=files["model"], counters=counters)
    yield s, client, trainer, publisher, counters
    s.close()


def test_the_transport_publishes_each_version_as_an_adapter_and_unloads_the_previous_one(sync):
    served, client, trainer, publisher, counters = sync
    for version in (1, 2):
        trainer.perturb(seed=version)
        entry = run(client, publisher.sync(trainer, version))
        name = publisher.transport.adapter_name(version)
        assert entry["mode"] == "adapter" and entry["adapter"] == name and entry["verified_tensors"] == 3
        files = [Path(entry["path"]) / f for f in ("adapter_config.json", "adapter_model.safetensors")]
        assert entry["bytes"] == sum(f.stat().st_size for f in files)
        assert list(served.engine.loaded_adapters()) == [name]  # the previous version was unloaded
        assert client.adapter.name == name and served.engine.weight_version == str(version)
        ours, theirs, served_version = run(client, policy_logprobs(client, trainer))
        assert served_version == str(version)
        assert torch.allclose(ours, theirs, atol=1e-4), (ours - theirs).abs().max()
    assert counters["weight_sync_lora_fallbacks"] == 0


def test_the_deepspeed_trainers_adapter_publishes_and_verifies(files, tmp_path):
    """The seam with the real trainer: DeepSpeed (one rank, gloo) training through peft."""
    from agentrl_cli.config.models import LoraConfig as LoraSettings
    from agentrl_cli.config.models import TrainingConfig
    from agentrl_cli.learner.deepspeed_backend import DeepSpeedBackend

    backend = DeepSpeedBackend(files["model"], TrainingConfig(micro_batch_size=2, lora=LoraSettings()))
    s = Served(files["model"])
    client = InferenceClient([s.url])
    try:
        with torch.no_grad():  # as train steps would: the adapter leaves its initialisation
            for name, p in backend.module.named_parameters():
                if "lora_" in name:
                    p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(3)) * 0.03)
        publisher = WeightPublisher(LoraTransport(client, tmp_path / "run", base_path=files["model"]), client)
        entry = run(client, publisher.sync(backend, 1))
        assert entry["mode"] == "adapter" and entry["verified_tensors"] == 3
        gen = run(client, client.generate(PROMPT, SamplingParams(max_new_tokens=6, temperature=0.0)))
        theirs = forward_logprobs(PeftModel.from_pretrained(load(files["model"]), entry["path"]).eval(),
                                  PROMPT + gen.output_ids)[-len(gen.output_ids):]
        assert torch.allclose(torch.tensor(gen.output_logprobs), theirs, atol=1e-4)
    finally:
        s.close()
        backend.close()



def test_verification_fails_when_the_servers_base_is_not_the_adapters(sync, files):
    served, client, trainer, publisher, _ = sync
    trainer.perturb(seed=1)
    served.post("/update_weights_from_disk", {"model_path": str(files["other"])})
    with pytest.raises(WeightSyncError, match=f"base weights plus LoRA adapter {publisher.transport.adapter_name(1)} differ"):
        run(client, publisher.sync(trainer, 1))


def test_a_restarted_server_gets_the_current_adapter_alone(sync):
    served, client, trainer, publisher, counters = sync
    trainer.perturb(seed=1)
    run(client, publisher.sync(trainer, 1))
    # what a restart leaves: launch weights (no adapter), launch version
    name = publisher.transport.adapter_name(1)
    served.engine.unload_lora_adapter(name)
    served.engine.set_weight_version("0")
    run(client, publisher.resync_servers())
    assert counters["weight_resyncs"] == 1 and not publisher.full_sync_due
    assert list(served.engine.loaded_adapters()) == [name] and served.engine.weight_version == "1"
    ours, theirs, _ = run(client, policy_logprobs(client, trainer))
    assert torch.allclose(ours, theirs, atol=1e-4)


def test_a_refused_adapter_falls_back_to_full_syncs_counted_once(sync, files):
    served, client, trainer, publisher, counters = sync
    trainer.perturb(seed=1)
    run(client, publisher.sync(trainer, 1))
    # the server refuses version 2's adapter: it has that name loaded from elsewhere
    assert served.engine.load_lora_adapter(publisher.transport.adapter_name(2), files["a2"])[0]
    trainer.perturb(seed=2)
    entry = run(client, publisher.sync(trainer, 2))
    assert entry["mode"] == "full" and "already loaded" in entry["fallback"] and entry["verified_tensors"] == 3
    assert counters["weight_sync_lora_fallbacks"] == 1
    # ours are unloaded; the adapter the server had under that name is not ours to unload
    assert served.engine.loaded_adapters() == {publisher.transport.adapter_name(2): str(files["a2"])}
    assert client.adapter.name is None
    ours, theirs, version = run(client, policy_logprobs(client, trainer))  # the base now holds the policy
    assert version == "2" and torch.allclose(ours, theirs, atol=1e-4)
    trainer.perturb(seed=3)
    entry = run(client, publisher.sync(trainer, 3))  # every later version is full too, and not counted again
    assert entry["mode"] == "full" and "fallback" not in entry and counters["weight_sync_lora_fallbacks"] == 1
    ours, theirs, version = run(client, policy_logprobs(client, trainer))
    assert version == "3" and torch.allclose(ours, theirs, atol=1e-4)


def test_adapter_payload_against_a_full_sync_of_the_built_in_model(files, tmp_path, capsys):
    """The built-in model's shapes (build_random uses its architecture), default target modules."""
    full = PeftTrainer(files["model"]).export_weights(tmp_path / "full")
    full_bytes = sum(f.stat().st_size for f in full.iterdir() if f.is_file())
    ratios = {}
    for rank in (4, 8):
        adapter = PeftTrainer(files["model"], rank=rank).export_adapter(tmp_path / f"r{rank}")
        adapter_bytes = sum((adapter / f).stat().st_size for f in ("adapter_config.json", "adapter_model.safetensors"))
        ratios[rank] = adapter_bytes / full_bytes
        with capsys.disabled():
            print(f"\nLoRA rank {rank}: adapter {adapter_bytes} bytes, full export {full_bytes} bytes, "
                  f"{100 * ratios[rank]:.2f}%")
    # the adapter grows with the rank (A and B are rank x in and out x rank per module)
    assert 1.9 < ratios[8] / ratios[4] < 2.0
    assert ratios[8] < 0.05  # the default rank: the adapter sync payload is under 5% of a full sync
