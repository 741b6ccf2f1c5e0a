"""Building the built-in model from its recipe (`model/recipe.py`): scripted demonstrations of practice
tasks of the training harnesses, then a supervised warm start, saved under a file lock so two
processes never build at once (a second waits, then finds the finished model)."""

from __future__ import annotations

import fcntl
from pathlib import Path
from typing import Callable

from agentrl_cli.model.recipe import PRACTICE_PER_FAMILY, SFT_STEPS, WARM_START_HARNESSES

Progress = Callable[[str, int, int], None]  # (phase, done, total)


def build_tiny(dest: Path, steps: int = SFT_STEPS, seed: int = 0, force: bool = False,
               progress: Progress = lambda phase, done, total: None) -> Path:
    """Build the built-in model at `dest` (demonstrations, warm start, save); returns `dest`."""
    from agentrl_cli.model.demos import collect
    from agentrl_cli.model.sft import train_sft
    from agentrl_cli.model.tiny import ARCH, init_model, is_complete, save_model_dir

    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.parent / f".{dest.name}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress("waiting for another process's build to finish", 0, 0)
            fcntl.flock(lock, fcntl.LOCK_EX)  # a second builder waits, then finds the finished model
        if is_complete(dest) and not force:
            return dest
        progress("demonstrations", 0, 0)
        demos = collect(list(WARM_START_HARNESSES), split=None, practice_per_family=PRACTICE_PER_FAMILY,
                        progress=lambda d, t: progress("demonstrations", d, t))
        progress("initialising the model", 0, 0)
        model, tokenizer = init_model(seed)
        progress("warm start", 0, steps)
        stats = train_sft(model, tokenizer, demos, steps=steps, progress=lambda s, loss: progress("warm start", s, steps))
        progress("saving", 0, 0)
        return save_model_dir(model, tokenizer, dest, {"kind": "sft", "seed": seed, "arch": ARCH,
                                                       "demonstrations": {"harnesses": list(WARM_START_HARNESSES), "count": len(demos),
                                                                          "practice_per_family": PRACTICE_PER_FAMILY},
                                                       "sft": stats})
