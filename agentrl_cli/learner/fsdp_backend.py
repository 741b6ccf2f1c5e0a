"""The PyTorch FSDP2 trainer backend (`training.backend: fsdp`): one rank of a GRPO policy whose
parameters, gradients and optimizer state are sharded over the ranks with
`torch.distributed.fsdp.fully_shard`, on CPU with gloo or on GPUs with NCCL. Implements
`backend.TrainingBackend`; the step, the parameter views and the exports are
`policy_rank.PolicyRank`'s, so switching `training.backend` changes no loss, mask, correction or
weight-sync behaviour.

What belongs here: sharding the model, backward and the optimizer step, gathering the shards for
reads, and checkpoints in torch.distributed.checkpoint's format.

Choices worth knowing:
- Each decoder layer is its own FSDP unit (gathered for its forward and backward, freed after), and
  the root holds the rest (embeddings, final norm, the head; tied embeddings stay one parameter).
  One rank is the same code with nothing to shard.
- Gradients are reduced only on the last micro-batch of a step (`set_requires_gradient_sync`);
  FSDP averages them over the ranks. The optimizer is torch AdamW (training.learning_rate, no weight
  decay) over the local shards; `training.max_grad_norm` clips the global norm, and
  the norm before clipping is the step's `grad_norm`.
- `training.precision` bf16 or fp16: the forward and backward compute in it while the sharded
  master weights and the optimizer stay fp32 and gradients are reduced in fp32
  (`MixedPrecisionPolicy`).
- `training.zero_stage` and `training.deepspeed_config` are DeepSpeed's and are not read here.
- Checkpoints: `shards/` holds the sharded model and optimizer state as torch.distributed.checkpoint
  writes them (one file per rank and a `.metadata`; the format can be loaded at another world
  size), `client_state.pt` the caller's resume data (written by rank 0), and the record every
  backend writes (`policy_rank.RECORD`): a DeepSpeed checkpoint is refused by name, not half loaded.
  With LoRA only the adapter and its optimizer state are saved.
"""

from __future__ import annotations

from pathlib import Path

import torch

from agentrl_cli.config.models import TrainingConfig
from agentrl_cli.core.errors import NotFoundError
from agentrl_cli.learner import lora
from agentrl_cli.learner.policy_rank import PolicyRank
from agentrl_cli.learner.process_group import ProcessGroup

SHARDS = "shards"  # not "dist": a name ignore files give to build output
CLIENT_STATE = "client_state.pt"
ENTROPY_KEY = "agentrl_entropy_coef"  # the adaptive entropy bonus (training.entropy_target) to resume with


class FSDPBackend(PolicyRank):
    """One rank of the policy under FSDP2. See `policy_rank.py` for the step semantics."""

    def __init__(self, model_path: str | Path, training_config: TrainingConfig, *,
                 tokenizer_path: str | Path | None = None, temperature: float = 1.0) -> None:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        self._pg = ProcessGroup(training_config.dist_backend)
        try:
            model = self._load_policy(model_path, training_config, tokenizer_path, temperature)
            model.to(self._pg.device)
            self._hf_class = type(model)  # fully_shard swaps the class for an FSDP subclass
            compute = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(training_config.precision)
            policy = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32) if compute else MixedPrecisionPolicy()
            for layer in _decoder_layers(model):
                fully_shard(layer, mp_policy=policy)
            self._model = fully_shard(model, mp_policy=policy)
            self._optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                                lr=training_config.learning_rate, weight_decay=0.0)
            self._steps = 0
            self._load_reference(model_path)
        except BaseException:
            self._pg.close()
            raise

    @property
    def step(self) -> int:
        return self._steps

    @property
    def module(self):
        return self._model

    @property
    def forward_model(self):
        return self._model

    @property
    def optimizer(self):
        return self._optimizer

    @property
    def device(self):
        return self._pg.device

    def _begin_micro_batch(self, last: bool) -> None:
        self._model.set_requires_gradient_sync(last)

    def _backward(self, loss) -> None:
        loss.backward()

    def _end_micro_batch(self, last: bool) -> float | None:
        if not last:
            return None
        params = [p for p in self._model.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, self.config.max_grad_norm) if params else torch.tensor(0.0)
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        self._optimizer.step()
        self._optimizer.zero_grad(set_to_none=True)
        self._steps += 1
        return float(norm)

    def _gathered(self, params):
        """Every FSDP unit unsharded inside the block: the module's parameters are whole tensors there."""
        return _Unsharded(self._model)

    def _plain_model(self):
        """A plain Hugging Face model holding copies of the whole (merged, with LoRA) weights: the
        sharded module's own state dict gives shards, and its gathered weights live in FSDP's buffers."""
        return lora.merged_model(self._model, self._hf_class, copy=True)

    def _state_options(self):
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        adapter_only = self.lora is not None  # the frozen base weights are the model directory's
        return StateDictOptions(ignore_frozen_params=adapter_only, strict=not adapter_only)

    def save_checkpoint(self, dir: Path, client_state: dict) -> None:
        """The sharded model and optimizer state (torch.distributed.checkpoint), the client state and
        the record; with LoRA the frozen base weights are left out (the model directory's)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        dir = Path(dir)
        model_state, optim_state = get_state_dict(self._model, self._optimizer, options=self._state_options())
        dcp.save({"model": model_state, "optim": optim_state, "step": self._steps}, checkpoint_id=str(dir / SHARDS))
        if self.rank == 0:
            torch.save({**client_state, ENTROPY_KEY: self.entropy_coef}, dir / CLIENT_STATE)
        self._write_record(dir)
        if self.world_size > 1:
            torch.distributed.barrier()

    def load_checkpoint(self, dir: Path) -> dict:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        dir = Path(dir)
        self._check_record(dir)
        if not (dir / SHARDS / ".metadata").is_file():
            raise NotFoundError(f"no FSDP checkpoint under {dir} (expected {dir / SHARDS}/.metadata)",
                                "point at a directory written by an fsdp trainer's save_checkpoint, or start without resuming")
        model_state, optim_state = get_state_dict(self._model, self._optimizer, options=self._state_options())
        state = {"model": model_state, "optim": optim_state, "step": 0}
        dcp.load(state, checkpoint_id=str(dir / SHARDS))
        set_state_dict(self._model, self._optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                       options=self._state_options())
        self._steps = int(state["step"])
        client = dict(torch.load(dir / CLIENT_STATE, weights_only=False))
        self.entropy_coef = float(client.pop(ENTROPY_KEY, self.entropy_coef))
        return client

    def close(self) -> None:
        self._model = None
        self._optimizer = None
        self._pg.close()


def _decoder_layers(model) -> list[torch.nn.Module]:
    """The repeated blocks of a Hugging Face causal LM (the units FSDP gathers one at a time)."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        inner = getattr(model, "model", None)
        layers = list(getattr(inner, "layers", []) or [])
    return layers


class _Unsharded:
    """Unshard every FSDP unit of `model` on entry, reshard on exit (all ranks together)."""

    def __init__(self, model) -> None:
        from torch.distributed.fsdp import FSDPModule

        self.units = [m for m in model.modules() if isinstance(m, FSDPModule)]

    def __enter__(self):
        for unit in self.units:
            unit.unshard()
        return self

    def __exit__(self, *exc) -> None:
        for unit in reversed(self.units):
            unit.reshard()
