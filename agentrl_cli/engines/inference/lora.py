"""LoRA adapters for the embedded engine, done by peft: reading an adapter directory (peft's
`save_pretrained` layout: adapter_config.json and adapter_model.safetensors), applying it to a
copy of the serving model (`get_peft_model` on the copy, the adapter's tensors loaded with
`set_peft_model_state_dict`, then `merge_and_unload`), and the rows an adapter adds to a named
weight (what weight sync verifies an adapter publish by).

An adapter that does not fit the model is refused with `AdapterError` naming what differs: not a
LoRA adapter, target modules the model does not have, a tensor of another shape (another rank or
hidden size), a LoRA tensor the file lacks or one the model has no place for, non-finite values.
The serving model itself is never touched: every adapter gets its own merged copy, so a request
served with an adapter computes exactly base + B·A·scale in every adapted layer, and a refused
adapter leaves nothing behind.

Not here: which adapters are loaded and which requests use them (`engine.py`), HTTP shapes
(`protocol.py`, `hf_server.py`).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path

import torch

CONFIG_FILE = "adapter_config.json"
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")
PREFIX = "base_model.model."  # peft's prefix of every saved key, before the model's own module name


class AdapterError(ValueError):
    """An adapter the engine refuses; `str(exc)` says what was wrong."""


@dataclass(frozen=True)
class AdapterFiles:
    """An adapter directory read into memory: its peft config and tensors (kept, so the adapter can
    be applied again to new base weights without its files), and the size of what was read."""

    path: str
    config: object  # peft.LoraConfig
    weights: dict[str, torch.Tensor]
    bytes: int


def payload_files(path: str | Path) -> list[Path]:
    """The files of an adapter directory a server reads: its config and its weights."""
    root = Path(path)
    return [root / name for name in (CONFIG_FILE, *WEIGHT_FILES) if (root / name).is_file()]


def read_adapter(path: str | Path) -> AdapterFiles:
    """Read a peft LoRA adapter directory; AdapterError when it is not one."""
    from peft import PeftConfig, PeftType
    from peft.utils import load_peft_weights

    root = Path(path)
    if not root.is_dir():
        raise AdapterError(f"{path} is not a directory; give the directory peft's save_pretrained wrote "
                           f"({CONFIG_FILE} and {WEIGHT_FILES[0]})")
    if not (root / CONFIG_FILE).is_file():
        raise AdapterError(f"{path} has no {CONFIG_FILE}; give the directory peft's save_pretrained wrote")
    if not any((root / name).is_file() for name in WEIGHT_FILES):
        raise AdapterError(f"{path} has no adapter weights ({' or '.join(WEIGHT_FILES)})")
    try:
        config = PeftConfig.from_pretrained(str(root))
    except (OSError, ValueError, TypeError, json.JSONDecodeError) as exc:
        raise AdapterError(f"{root / CONFIG_FILE} is not a peft adapter config: {exc}") from None
    if config.peft_type != PeftType.LORA:
        raise AdapterError(f"{path} is a {config.peft_type} adapter; only LoRA adapters are served")
    try:
        weights = load_peft_weights(str(root), device="cpu")
    except Exception as exc:  # noqa: BLE001 - safetensors and torch raise many kinds for a damaged file
        raise AdapterError(f"the adapter weights in {path} cannot be read: {type(exc).__name__}: {exc}") from None
    bad = sorted(k for k, t in weights.items() if t.is_floating_point() and not torch.isfinite(t).all())
    if bad:
        raise AdapterError(f"the adapter in {path} has non-finite values in {len(bad)} tensor(s), e.g. {bad[0]}")
    return AdapterFiles(str(path), config, weights, sum(f.stat().st_size for f in payload_files(root)))


def merged_model(base, adapter: AdapterFiles):
    """A copy of `base` with `adapter` merged into its weights; `base` is left as it was."""
    from peft import get_peft_model
    from peft.utils import set_peft_model_state_dict

    model = copy.deepcopy(base)
    config = copy.deepcopy(adapter.config)
    config.inference_mode = True
    try:
        wrapped = get_peft_model(model, config)
    except ValueError as exc:  # peft: "Target modules {...} not found in the base model"
        raise AdapterError(f"the adapter does not fit the model: {exc}") from None
    try:
        result = set_peft_model_state_dict(wrapped, adapter.weights)
    except RuntimeError as exc:  # load_state_dict: "size mismatch for ...": another rank or model size
        first = next((line.strip() for line in str(exc).splitlines() if "size mismatch" in line), str(exc))
        raise AdapterError(f"the adapter's tensors do not fit the model ({first}); it was trained for another "
                           "model or with another rank than its config says") from None
    missing = sorted(k for k in result.missing_keys if "lora_" in k)
    if missing or result.unexpected_keys:
        what = (f"{len(missing)} LoRA tensor(s) missing from the file, e.g. {missing[0]}" if missing else
                f"{len(result.unexpected_keys)} tensor(s) the model has no place for, e.g. {result.unexpected_keys[0]}")
        raise AdapterError(f"the adapter does not match its own config: {what}")
    merged = wrapped.merge_and_unload()
    merged.eval().requires_grad_(False)
    return merged


def delta_rows(adapter: AdapterFiles, name: str, rows: int) -> torch.Tensor | None:
    """The first `rows` rows of what `adapter` adds to the model weight `name` (a Hugging Face
    parameter name, e.g. model.layers.0.self_attn.q_proj.weight): (B[:rows] @ A) * scale, in float32;
    None when the adapter leaves that weight alone. DoRA adapters scale the merged weight as a whole,
    so no row of theirs is computed alone: AdapterError."""
    from peft.utils.other import get_pattern_key

    module = name.removesuffix(".weight")
    a = adapter.weights.get(f"{PREFIX}{module}.lora_A.weight")
    b = adapter.weights.get(f"{PREFIX}{module}.lora_B.weight")
    if a is None or b is None:
        return None
    config = adapter.config
    if getattr(config, "use_dora", False):
        raise AdapterError("a DoRA adapter's merged rows cannot be computed from its A and B alone")
    rank = a.shape[0]
    alpha_pattern = getattr(config, "alpha_pattern", None) or {}
    alpha = alpha_pattern.get(get_pattern_key(alpha_pattern.keys(), module), config.lora_alpha)
    scale = alpha / (rank ** 0.5) if getattr(config, "use_rslora", False) else alpha / rank
    if getattr(config, "fan_in_fan_out", False):  # the weight is stored transposed (GPT-2's Conv1D)
        return (b.float() @ a.float()).T[:rows] * scale
    return (b[:rows].float() @ a.float()) * scale


@dataclass(eq=False)
class Adapter:
    """A loaded LoRA adapter: the serving base with it merged in, and that model's prefix cache."""

    name: str
    files: AdapterFiles
    model: object
    weight_version: str
    prefix_cache: object  # its PrefixCache (engines/inference/prefix_cache.py)
    replaced_by: "Adapter | None" = None  # the same adapter merged onto the base a weight update swapped in

    def current(self) -> "Adapter":
        adapter = self
        while adapter.replaced_by is not None:
            adapter = adapter.replaced_by
        return adapter
