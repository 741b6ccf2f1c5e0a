"""Resolve `model.path` to a Hugging Face model directory, building the built-in tiny model on
first use: scripted demonstrations of practice tasks of the training harnesses (never a task of
the committed task sets, see `model/demos.py`), then a supervised warm start, saved under
`model.cache_dir`. A file lock keeps two processes from building at once."""

from __future__ import annotations

import fcntl
from pathlib import Path
from typing import Callable

from agentrl_cli.errors import ConfigError, NotFoundError
from agentrl_cli.model.recipe import PRACTICE_PER_FAMILY, SFT_STEPS, WARM_START_HARNESSES
from agentrl_cli.model.tiny import ARCH, RECIPE_VERSION, init_model, is_complete, save_model_dir

BUILTINS = ("tiny-agent",)


def builtin_dir(cache_dir: str, name: str = "tiny-agent") -> Path:
    return Path(cache_dir).expanduser() / "models" / f"{name}-r{RECIPE_VERSION}"


def resolve_model_path(path: str, cache_dir: str, build: bool = True,
                       progress: Callable[[str, int, int], None] = lambda phase, done, total: None) -> Path:
    if path.startswith("builtin:"):
        name = path.removeprefix("builtin:")
        if name not in BUILTINS:
            raise ConfigError(f"unknown built-in model {path!r}", f"use one of: {', '.join('builtin:' + b for b in BUILTINS)}")
        dest = builtin_dir(cache_dir, name)
        if is_complete(dest):
            return dest
        if not build:
            raise NotFoundError(f"the built-in model is not built yet ({dest})", "run `agentrl model build-tiny`")
        return build_tiny(dest, progress=progress)
    p = Path(path).expanduser()
    if not (p / "config.json").exists():
        raise ConfigError(f"model.path {str(p)!r} is not a Hugging Face model directory (no config.json there)",
                          "point model.path at a directory holding config.json, tokenizer files and weights, "
                          "or use builtin:tiny-agent")
    return p


def build_tiny(dest: Path, steps: int = SFT_STEPS, seed: int = 0, force: bool = False,
               progress: Callable[[str, int, int], None] = lambda phase, done, total: None) -> Path:
    """Build the built-in model at `dest` (demonstrations, warm start, save); returns `dest`."""
    from agentrl_cli.model.demos import collect
    from agentrl_cli.model.sft import train_sft

    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.parent / f".{dest.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second builder waits, then finds the finished model
        if is_complete(dest) and not force:
            return dest
        demos = collect(list(WARM_START_HARNESSES), split=None, practice_per_family=PRACTICE_PER_FAMILY,
                        progress=lambda d, t: progress("demonstrations", d, t))
        model, tokenizer = init_model(seed)
        stats = train_sft(model, tokenizer, demos, steps=steps, progress=lambda s, loss: progress("warm start", s, steps))
        return save_model_dir(model, tokenizer, dest, {"kind": "sft", "seed": seed, "arch": ARCH,
                                                       "demonstrations": {"harnesses": list(WARM_START_HARNESSES), "count": len(demos),
                                                                          "practice_per_family": PRACTICE_PER_FAMILY},
                                                       "sft": stats})
