"""Loading a model directory into the embedded engine (`engine.py`): a full transformers load, or,
when the directory is what a trainer exports at every sync (one safetensors file with the serving
model's config), its tensors copied into a copy of the serving model, a third of the cost of
building the model anew. Also the helpers the engine's weight swaps use: whether two models have the
same tensors (so a retired model can take the next update's weights), copying weights between them,
and a model's end-of-sequence ids.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_file as load_safetensors
from transformers import AutoModelForCausalLM, AutoTokenizer

# transformers' from_pretrained patches process-wide state while it builds a model (tie-weights and
# init switches, the default dtype); two loads in parallel threads corrupt each other (untied or
# meta-device weights). This lock holds no data: it only keeps loads in this process one at a time.
LOAD_LOCK = threading.Lock()

# config keys that name or describe a saved file rather than the architecture
CONFIG_NOT_ARCHITECTURE = frozenset({"_name_or_path", "transformers_version", "torch_dtype", "dtype", "_commit_hash",
                                     "_attn_implementation_autoset"})


def load_tokenizer(path: str):
    with LOAD_LOCK:
        return AutoTokenizer.from_pretrained(path)


def load_model(path: str, dtype: str, device: torch.device, serving=None, copy_of_serving: Callable | None = None):
    """The model at `path` in eval mode without gradients, on `device`: loaded into a copy of `serving`
    (`into_copy`) when it can be, else in full. Raises when any parameter was not loaded."""
    model = into_copy(path, serving, dtype, copy_of_serving) if serving is not None else None
    if model is None:
        with LOAD_LOCK:
            model = AutoModelForCausalLM.from_pretrained(path, dtype="auto" if dtype == "auto" else getattr(torch, dtype))
        model.to(device)  # a copy of the serving model (into_copy) is there already
    model.eval().requires_grad_(False)
    on_meta = [name for name, p in model.named_parameters() if p.device.type == "meta"]
    if on_meta:
        raise RuntimeError(f"{len(on_meta)} parameters were not loaded (e.g. {on_meta[0]})")
    return model


def into_copy(path: str, serving, dtype: str, copy_of_serving: Callable):
    """A copy of `serving` (`copy_of_serving()` makes it) holding `path`'s weights, when `path` is one
    safetensors file with the serving model's config. None when anything differs or is missing (a
    tensor not tied to a loaded one, an unknown name, another shape): then the full load."""
    weights, config = Path(path) / "model.safetensors", Path(path) / "config.json"
    if not weights.is_file() or not config.is_file():
        return None
    try:
        theirs = type(serving.config).from_dict(json.loads(config.read_text())).to_dict()
    except (OSError, ValueError, TypeError):
        return None
    ours = serving.config.to_dict()
    if any(theirs.get(k) != ours.get(k) for k in set(theirs) | set(ours) if k not in CONFIG_NOT_ARCHITECTURE):
        return None
    model = copy_of_serving()
    try:
        tensors = load_safetensors(str(weights))
        result = model.load_state_dict(tensors, strict=False)
    except (OSError, RuntimeError, ValueError):
        return None
    state = model.state_dict()
    if dtype == "auto" and any(t.dtype != state[k].dtype for k, t in tensors.items() if k in state):
        return None  # "auto" serves a file in its own dtype: only a full load does that
    loaded = {state[k].data_ptr() for k in tensors}
    if result.unexpected_keys or any(state[k].data_ptr() not in loaded for k in result.missing_keys):
        return None
    return model


def copy_weights(target, source) -> None:
    """Every tensor of `source` into the same-shaped model `target`, in place."""
    with torch.no_grad():
        for t, s in zip(target.state_dict(keep_vars=True).values(), source.state_dict(keep_vars=True).values()):
            t.copy_(s)


def same_shapes(a, b) -> bool:
    """Whether two models have the same state-dict keys, shapes and dtypes, in the same order."""
    sa, sb = a.state_dict(keep_vars=True), b.state_dict(keep_vars=True)
    return list(sa) == list(sb) and all(x.shape == y.shape and x.dtype == y.dtype for x, y in zip(sa.values(), sb.values()))


def eos_ids(model, tokenizer) -> set[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None)
        ids.update([value] if isinstance(value, int) else (value or ()))
    return ids
