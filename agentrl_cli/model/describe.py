"""What a model directory is, for `agentrl model info` and the stage reports: how it was built or
imported (its card), parameters (from the safetensors headers, without loading the weights),
vocabulary, chat-template features and stop tokens."""

from __future__ import annotations

import json
from pathlib import Path


def card(directory: Path) -> dict | None:
    """The model's card: an imported model's `agentrl-model.json`, or the built-in model's build
    record; None when the directory has neither. Reads JSON only (cheap enough for every report)."""
    from agentrl_cli.model.importer import read_card
    from agentrl_cli.model.tiny import COMPLETE

    found = read_card(directory)
    if found is not None:
        return found
    try:
        built = json.loads((Path(directory) / COMPLETE).read_text())
    except (OSError, ValueError):
        return None
    return {"name": Path(directory).name, "source": {"kind": "builtin"}, "build": built}


def parameter_count(directory: Path) -> int | None:
    """Parameters stored in the directory's safetensors files (tied weights count once); None without any."""
    from safetensors import safe_open

    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for key in st.keys():
                n = 1
                for d in st.get_slice(key).get_shape():
                    n *= d
                total += n
    return total


def describe(directory: Path) -> dict:
    """Directory, card, parameters, vocabulary, chat-template features and stop tokens."""
    from transformers import AutoTokenizer

    from agentrl_cli.model.chat import chat_format

    tokenizer = AutoTokenizer.from_pretrained(directory)
    out = {"directory": str(directory), "card": card(directory), "parameters": parameter_count(directory),
           "vocabulary": len(tokenizer), "eos_token": tokenizer.eos_token}
    try:
        out["chat"] = chat_format(tokenizer).describe(tokenizer)
    except ValueError as exc:
        out["chat"] = {"error": str(exc)}
    return out
