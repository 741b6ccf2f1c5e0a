"""The built-in tiny model (`model.path: builtin:tiny-agent`): a small Llama-architecture causal LM
with the byte-level BPE tokenizer and the chat template, saved as an ordinary Hugging Face model
directory. `save_model_dir` writes atomically (temp directory, then rename) and marks the
directory complete, so a killed build never leaves a directory that loads half-written.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

from agentrl_cli.model.tokenizer import build_tokenizer

RECIPE_VERSION = "5"  # bump when the architecture, tokenizer or warm-start recipe changes
ARCH = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
            max_position_embeddings=2048, rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=True)
COMPLETE = "agentrl.json"  # written last: its presence means the directory is complete


def tiny_config(tokenizer, **overrides) -> LlamaConfig:
    vocab = (len(tokenizer) + 7) // 8 * 8
    return LlamaConfig(vocab_size=vocab, bos_token_id=None, eos_token_id=tokenizer.eos_token_id,
                       pad_token_id=tokenizer.pad_token_id, **{**ARCH, **overrides})


def init_model(seed: int = 0, **overrides):
    """(model, tokenizer) with freshly initialised weights."""
    tokenizer = build_tokenizer()
    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_config(tokenizer, **overrides))
    model.generation_config = GenerationConfig(eos_token_id=[tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id,
                                               bos_token_id=None, do_sample=False)
    return model, tokenizer


ONE_FILE_MAX_BYTES = 2 << 30  # larger models go through save_pretrained, which shards them


def _save_weights(model, path: Path) -> None:
    """The model's config, generation config and weights as `save_pretrained` writes them for a model
    that fits one file (tied parameters stored once, "pt" metadata), without its per-call planning
    (sharding, metadata checks): 1-2 ms instead of ~16 ms for the built-in model, at every weight
    sync. Larger models are saved by `save_pretrained` itself."""
    from safetensors.torch import save_file

    state, seen = {}, set()
    for name, tensor in model.state_dict().items():
        if tensor.data_ptr() in seen:
            continue  # a tied weight (lm_head = embed_tokens): stored under its first name
        seen.add(tensor.data_ptr())
        state[name] = tensor.detach().contiguous()
    if sum(t.numel() * t.element_size() for t in state.values()) > ONE_FILE_MAX_BYTES:
        model.save_pretrained(path, safe_serialization=True)
        return
    config = model.config.to_dict()
    config["architectures"] = [type(model).__name__]  # as save_pretrained records them
    config["dtype"] = str(model.dtype).removeprefix("torch.")
    type(model.config).from_dict(config).save_pretrained(path)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(path)
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})


@contextlib.contextmanager
def replacing_dir(path: Path):
    """A temporary directory beside `path` to fill; when the block ends, it replaces `path` whole (a
    rename), and when the block raises, it is removed: `path` is never half written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        yield tmp
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def save_model_dir(model, tokenizer, path: Path, info: dict) -> Path:
    """Write a complete Hugging Face model directory at `path` (atomically replacing nothing partial)."""
    with replacing_dir(path) as tmp:
        _save_weights(model, tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / COMPLETE).write_text(json.dumps({"recipe_version": RECIPE_VERSION, **info}, indent=2) + "\n")
    return Path(path)


def build_random(path: Path, seed: int = 0, **overrides) -> Path:
    """A tiny model directory with random weights (tests, protocol checks)."""
    model, tokenizer = init_model(seed, **overrides)
    return save_model_dir(model, tokenizer, path, {"kind": "random", "seed": seed, "arch": {**ARCH, **overrides}})


def is_complete(path: Path) -> bool:
    return (Path(path) / COMPLETE).exists() and (Path(path) / "config.json").exists()
