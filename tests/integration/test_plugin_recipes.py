"""A weight transport and a training backend written only from the documented recipes (docs/development.md,
"Where to add"), named in the config by `module:Class`, train a real async run: the rollout runs beside the
trainer, every publish overlaps the next step and is verified against the trainer's weights, the
servers end at the last version, checkpoints are written by the backend and a second run resumes
from one."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from agentrl_cli.config import load_config
from agentrl_cli.run.training_run import train
from agentrl_cli.learner.grpo import collate, ppo_clip_loss, token_logprobs
from agentrl_cli.weightsync.base import Prepared, Published
from tests.conftest import free_port
from tests.integration.conftest import needs_bwrap

pytestmark = [pytest.mark.integration, needs_bwrap]


class ScratchDirTransport:
    """Weights through a fresh scratch directory per version, removed once the next one is loaded."""

    name = "scratch"

    def __init__(self, client) -> None:
        self.client, self.loaded, self.published = client, None, []

    @classmethod
    def from_config(cls, cfg, client, workdir: Path) -> "ScratchDirTransport":
        return cls(client)

    async def prepare(self, backend, version: int) -> Prepared:
        path = Path(tempfile.mkdtemp(prefix=f"scratch-v{version}-"))
        await asyncio.to_thread(backend.export_weights, path)
        return Prepared(version=version, payload=path, rank=backend.rank)

    async def publish(self, prepared: Prepared) -> Published:
        await self.client.update_weights_from_disk(str(prepared.payload), str(prepared.version))
        if self.loaded is not None:
            shutil.rmtree(self.loaded, ignore_errors=True)
        self.loaded = prepared.payload
        self.published.append(prepared.version)
        return Published(prepared.version, self.name, details={"scratch": str(prepared.payload)})

    async def resend(self, urls: list[str], last: Published) -> bool:
        return False

    async def close(self) -> None:
        if self.loaded is not None:
            shutil.rmtree(self.loaded, ignore_errors=True)


class PlainTorchBackend:
    """One process, plain torch AdamW on a Hugging Face causal LM, the GRPO loss from learner/grpo.py."""

    rank, world_size = 0, 1
    built: list = []

    def __init__(self, model_path: str, training_config) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.config, self.step = training_config, 0
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=training_config.learning_rate)
        self.built.append(self)

    def train_step(self, samples) -> dict:
        batch = collate(samples, self.tokenizer.pad_token_id or 0, max_len=self.config.seq_len_limit)
        self.model.train()
        new_lp, entropy = token_logprobs(self.model, batch)
        loss, metrics = ppo_clip_loss(new_lp, batch.old_logprobs, batch.advantages, batch.loss_mask, self.config.clip_eps,
                                      entropy=entropy, num_tokens=batch.num_tokens)
        self.optimizer.zero_grad()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm)
        self.optimizer.step()
        self.step += 1
        return {**metrics, "loss": float(loss.detach()), "grad_norm": float(grad_norm), "lr": self.config.learning_rate,
                "tokens": batch.num_tokens, "samples": len(samples)}

    def save_checkpoint(self, dir: Path, client_state: dict) -> None:
        Path(dir).mkdir(parents=True, exist_ok=True)
        torch.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), "step": self.step,
                    "client": client_state}, Path(dir) / "state.pt")

    def load_checkpoint(self, dir: Path) -> dict:
        state = torch.load(Path(dir) / "state.pt", weights_only=False)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step = state["step"]
        return state["client"]

    def export_weights(self, dir: Path) -> Path:
        self.model.save_pretrained(dir)
        self.tokenizer.save_pretrained(dir)
        return Path(dir)

    def parameter_names(self):
        return [(name, tuple(p.shape)) for name, p in self.model.named_parameters(remove_duplicate=False)]

    def named_parameter_sample(self, names, n):
        params = dict(self.model.named_parameters(remove_duplicate=False))
        return {name: params[name].detach().flatten()[:n].tolist() for name in names}

    def named_tensors(self):
        return {name: p.detach().clone() for name, p in self.model.named_parameters()}

    def close(self) -> None:
        self.model = self.optimizer = None


def test_a_transport_and_a_backend_from_the_readme_recipe_train_an_async_run(tmp_path, random_model_dir):
    here = __name__
    sets = {"inference.port": free_port(), "inference.max_new_tokens": 8, "rollout.concurrency": 8,
            "rollout.group_size": 2, "rollout.max_steps_per_trajectory": 1, "rollout.weight_sync_interval_steps": 1,
            "rollout.mode": "async", "rollout.max_staleness": 1, "training.micro_batch_size": 4,
            "training.checkpoint_interval_steps": 2, "data.root": str(tmp_path / "store"), "model.path": str(random_model_dir),
            "training.backend": f"{here}:PlainTorchBackend", "training.weight_sync": f"{here}:ScratchDirTransport"}
    cfg = load_config(None, [f"{k}={v}" for k, v in sets.items()] + ['harnesses=[{"name": "terminal_like"}]'], env={}).config
    PlainTorchBackend.built.clear()
    first = asyncio.run(train(cfg, tmp_path / "run", random_model_dir, 3, run_id="recipes"))

    assert [type(b).__name__ for b in PlainTorchBackend.built] == ["PlainTorchBackend"]
    assert first.steps == 3 and first.version == 3
    # every publish overlapped a train step and the servers' read-back matched the trainer's weights
    assert [s["version"] for s in first.syncs] == [1, 2, 3] and all(s["transport"] == "scratch" for s in first.syncs)
    assert all(s["verified_tensors"] >= 1 for s in first.syncs)
    assert all(isinstance(m["train/loss"], float) and m["train/loss"] == m["train/loss"] for m in first.metrics)
    assert first.checkpoints == ["step-00000002", "step-00000003"]
    assert (tmp_path / "run" / "checkpoints" / "step-00000003" / "engine" / "state.pt").is_file()

    second = asyncio.run(train(cfg, tmp_path / "run", random_model_dir, 4, run_id="recipes"))
    assert second.resumed_from == "step-00000003" and second.start_step == 3 and second.steps == 4
    assert PlainTorchBackend.built[-1].step == 4  # the optimizer step came back from the backend's own checkpoint
