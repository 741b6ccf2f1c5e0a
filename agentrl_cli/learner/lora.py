"""LoRA on the trainer side (`training.lora`): peft's adapters on a loaded model, and the views of
the adapted model that the rest of agentrl asks for.

What belongs here: wrapping a Hugging Face causal LM with peft (`wrap`), the names and MERGED values
of its ordinary Hugging Face parameters (`hf_parameters`, `merged_value`, `merged_model`), the
adapter's own parameters (`adapter_parameters`), the base model with the adapters switched off
(`AdaptersOff`, the KL reference) and peft's adapter directory (`save_adapter`). Not here: the
engine, ZeRO-3 gathering and which rank writes (`deepspeed_backend.py`), serving an adapter
(`engines/inference/`), sending one (`weightsync/`).

Conventions:
- One adapter, peft's "default". DeepSpeed trains the Hugging Face model itself with peft's layers
  injected (`PeftModel.get_base_model()`): for LoRA, `PeftModelForCausalLM.forward` only forwards
  to it, and the model's own forward signature (`logits_to_keep`, the cache argument) stays visible
  to `grpo.py` and `shared_prompts.py`.
- A LoRA layer at `X` keeps the original weight at `X.base_layer.weight` and the adapter at
  `X.lora_A.default.weight`, `X.lora_B.default.weight`. Its ordinary name is `X.weight` and its
  merged value `W + scaling * B @ A` (peft's `get_delta_weight`), computed from the live tensors:
  the training model is never merged in place.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from agentrl_cli.core.errors import ConfigError

ADAPTER = "default"  # peft's name of the single adapter
ADAPTABLE = (torch.nn.Linear, torch.nn.Embedding, torch.nn.Conv1d, torch.nn.Conv2d)


def adaptable_names(model: torch.nn.Module) -> list[str]:
    """The distinct last components of the module names LoRA can adapt (Linear, Embedding, Conv layers)."""
    try:
        from transformers.pytorch_utils import Conv1D
        kinds = (*ADAPTABLE, Conv1D)
    except ImportError:  # pragma: no cover - every supported transformers has it
        kinds = ADAPTABLE
    return sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules() if name and isinstance(m, kinds)})


def _matches(target: str, names: list[str]) -> bool:
    """peft's rule for a list of target names: the whole module name, or its last dotted components."""
    return any(name == target or name.endswith(f".{target}") for name in names)


def wrap(model: torch.nn.Module, config):
    """`model` with peft LoRA adapters of `config` (a config.models.LoraConfig) injected; returns the
    PeftModel. Only the adapters' parameters require gradients afterwards. A target module name that
    matches nothing in the model is a ConfigError listing the names it has."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    names = [name for name, _ in model.named_modules() if name]
    missing = [t for t in config.target_modules if not _matches(t, names)]
    hint = (f"set training.lora.target_modules to names of this model's layers: {', '.join(adaptable_names(model))}")
    if missing:
        raise ConfigError(f"training.lora.target_modules names {', '.join(missing)}, which match(es) no module of "
                          f"{type(model).__name__}", hint)
    peft_config = PeftLoraConfig(r=config.rank, lora_alpha=config.alpha, lora_dropout=config.dropout,
                                 target_modules=list(config.target_modules), task_type="CAUSAL_LM")
    try:
        return get_peft_model(model, peft_config)
    except ValueError as exc:  # e.g. a target that is a block, not a layer peft can adapt
        raise ConfigError(f"peft cannot put LoRA on training.lora.target_modules={list(config.target_modules)}: {exc}",
                          hint) from exc


def lora_layers(module: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """{name: layer} of every peft LoRA layer in `module`."""
    if "peft.tuners.lora" not in sys.modules:
        return {}  # none can exist before peft is imported (and a full fine-tuning run never imports it)
    from peft.tuners.lora import LoraLayer

    return {name: m for name, m in module.named_modules() if isinstance(m, LoraLayer)}


def adapter_parameters(module: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """(name in `module`, parameter) of every adapter parameter: those of a LoRA layer outside its base layer."""
    out = []
    for prefix, layer in lora_layers(module).items():
        out += [(f"{prefix}.{name}", p) for name, p in layer.named_parameters() if not name.startswith("base_layer.")]
    return out


def hf_parameters(module: torch.nn.Module, *, remove_duplicate: bool = True):
    """(ordinary Hugging Face name, stored parameter, LoRA layer or None) for every parameter of the
    model without the adapters, in `named_parameters` order: a LoRA layer's base weight under the name
    it had before peft, with the layer whose delta merges into it; its bias with None; the adapter
    parameters left out. A parameter shared by several names (tied embeddings) merges the same way
    under each of them."""
    layers = lora_layers(module)
    adapters = {id(p) for _, p in adapter_parameters(module)}
    merging = {id(layer.base_layer.weight): layer for layer in layers.values()}
    out = []
    for name, p in module.named_parameters(remove_duplicate=remove_duplicate):
        if id(p) in adapters:
            continue
        for prefix in layers:
            if name.startswith(f"{prefix}.base_layer."):
                name = prefix + name[len(prefix) + len(".base_layer"):]
                break
        out.append((name, p, merging.get(id(p))))
    return out


def merge_inputs(param: torch.nn.Parameter, layer) -> list[torch.nn.Parameter]:
    """The parameters `merged_value(param, layer)` reads (to gather them under ZeRO-3)."""
    if layer is None:
        return [param]
    return [param, layer.lora_A[ADAPTER].weight, layer.lora_B[ADAPTER].weight]


def merged_value(param: torch.Tensor, layer) -> torch.Tensor:
    """A detached tensor: `param` plus `layer`'s adapter delta when `layer` is given (summed in fp32,
    returned in the parameter's dtype), else `param` itself (detached, not copied)."""
    if layer is None:
        return param.detach()
    delta = layer.get_delta_weight(ADAPTER).detach()
    return (param.detach().float() + delta.float()).to(param.dtype)


def merged_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict under its ordinary names with merged values (persistent buffers too,
    tied parameters under each name, sharing one tensor); the parameters must be whole (gathered)."""
    values = {}
    merged: dict[int, torch.Tensor] = {}
    for name, p, layer in hf_parameters(module, remove_duplicate=False):
        if id(p) not in merged:
            merged[id(p)] = merged_value(p, layer)
        values[name] = merged[id(p)]
    prefixes = list(lora_layers(module))
    for name, buffer in module.named_buffers(remove_duplicate=False):
        owner, _, leaf = name.rpartition(".")
        if leaf in (module.get_submodule(owner) if owner else module)._non_persistent_buffers_set:
            continue  # as state_dict leaves it out
        for prefix in prefixes:
            if name.startswith(f"{prefix}.base_layer."):
                name = prefix + name[len(prefix) + len(".base_layer"):]
                break
        values[name] = buffer.detach()
    return values


def merged_model(module: torch.nn.Module, cls: type | None = None, *, copy: bool = False) -> torch.nn.Module:
    """A plain Hugging Face model of `module`'s class (or `cls`) and config holding the merged weights:
    built on the meta device and given the merged tensors (new ones for adapted weights, the stored
    ones for the rest, or copies of every one with `copy`), so only the adapted weights are copied.
    For saving; the parameters must be whole."""
    state = merged_state_dict(module)
    if copy:  # parameters that live in a gathering engine's buffers
        state = {name: value.detach().clone() for name, value in state.items()}
    with torch.device("meta"):
        plain = (cls or type(module))(module.config)
    plain.load_state_dict(state, assign=True, strict=True)
    if getattr(module, "generation_config", None) is not None:
        plain.generation_config = module.generation_config
    return plain.eval()


class AdaptersOff:
    """The base model without its adapters, callable like the model: the KL reference when LoRA
    trains, instead of a second copy of the weights. `module` is the adapted model, so the forward
    signature seen through it is the model's own (as through a DeepSpeed engine)."""

    def __init__(self, peft_model, module: torch.nn.Module) -> None:
        self.peft_model, self.module = peft_model, module

    def __call__(self, *args, **kwargs):
        with self.peft_model.disable_adapter():
            return self.module(*args, **kwargs)


def save_adapter(peft_model, directory: Path) -> Path:
    """peft's adapter directory (adapter_config.json, adapter_model.safetensors) at `directory`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    # the adapter's values as the parameters hold them (a sharding engine's state_dict gives shards)
    state = {name: p.detach().clone() for name, p in peft_model.named_parameters() if "lora_" in name}
    peft_model.save_pretrained(str(directory), safe_serialization=True, state_dict=state)
    return directory
