"""Resolve `model.path` to a Hugging Face model directory: a directory, the name of a model imported
with `agentrl model import` (`model/importer.py`), or a built-in model, installed into `model.cache_dir`
on first use from the copy shipped in the package (`model/shipped.py`), or, where that copy cannot be
used (another recipe's, a file that fails its checksum), built: scripted demonstrations of practice
tasks of the training harnesses (never a task of the committed task sets, see `model/demos.py`),
then a supervised warm start. A file lock keeps two processes from building at once. A build shows
its progress on stderr (`observe.progress.WorkProgress`: demonstrations, then warm-start steps, with
ETA) unless the caller takes the progress itself."""

from __future__ import annotations

import fcntl
from pathlib import Path
from typing import Callable

from agentrl_cli.core.errors import ConfigError, NotFoundError
from agentrl_cli.model.build import build_tiny

BUILTINS = ("tiny-agent",)
Progress = Callable[[str, int, int], None]  # (phase, done, total)


def builtin_dir(cache_dir: str, name: str = "tiny-agent") -> Path:
    from agentrl_cli.model.tiny import RECIPE_VERSION

    return Path(cache_dir).expanduser() / "models" / f"{name}-r{RECIPE_VERSION}"


def resolve_model_path(path: str, cache_dir: str, build: bool = True, progress: Progress | None = None,
                       builder: Callable[..., Path] | None = None) -> Path:
    """The model directory `path` names. A built-in model not in the cache yet is installed or built
    here (`builder`, default `install_builtin`), its progress shown on stderr from the first moment (looking in the cache
    takes the model libraries' import), or reported to `progress` when given."""
    if path.startswith("builtin:"):
        name = path.removeprefix("builtin:")
        if name not in BUILTINS:
            raise ConfigError(f"unknown built-in model {path!r}", f"use one of: {', '.join('builtin:' + b for b in BUILTINS)}")
        if not build or progress is not None:
            return _builtin(name, cache_dir, build, builder or install_builtin, progress or (lambda phase, done, total: None))
        from agentrl_cli.core.progress import WorkProgress

        with WorkProgress(f"model {path}", phase=f"looking in {cache_dir} (installed there on first use from the package)") as shown:
            found = _builtin(name, cache_dir, build, None, shown.update)
            if found is not None:
                shown.outcome = f"found at {found}"
                return found
            shown.update("installing", 0, 0)
            built = (builder or install_builtin)(builtin_dir(cache_dir, name), progress=shown.update)
            shown.outcome = f"{'installed' if _installed(built) else 'built'} at {built}"
            return built
    p = Path(path).expanduser()
    if not p.exists() and "/" not in path:  # a bare name: a model imported with `agentrl model import`
        from agentrl_cli.model.importer import imported_dir

        return imported_dir(path, cache_dir)
    if not (p / "config.json").exists():
        raise ConfigError(f"model.path {str(p)!r} is not a Hugging Face model directory (no config.json there)",
                          "point model.path at a directory holding config.json, tokenizer files and weights, "
                          "or use builtin:tiny-agent")
    return p


def _builtin(name: str, cache_dir: str, build: bool, builder: Callable[..., Path] | None, progress: Progress) -> Path | None:
    """The built-in model's directory when complete; else built with `builder` (None: return None)."""
    from agentrl_cli.model.tiny import is_complete

    dest = builtin_dir(cache_dir, name)
    if is_complete(dest):
        return dest
    if not build:
        raise NotFoundError(f"the built-in model is not built yet ({dest})", "run `agentrl model build-tiny`")
    return None if builder is None else builder(dest, progress=progress)


def _installed(path: Path) -> bool:
    from agentrl_cli.model.describe import card

    return "installed" in ((card(path) or {}).get("build") or {})


def install_builtin(dest: Path, progress: Progress = lambda phase, done, total: None) -> Path:
    """The built-in model at `dest`: the shipped copy installed (about a second), or, where it cannot
    be used, built from the recipe (`build_tiny`, several minutes), the reason shown first."""
    from agentrl_cli.model import shipped

    why = shipped.problem()
    if why is None:
        dest.parent.mkdir(parents=True, exist_ok=True)
        with open(dest.parent / f".{dest.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # a build or install under way: wait, then find it done
            from agentrl_cli.model.tiny import is_complete

            return dest if is_complete(dest) else shipped.install(dest)
    progress(f"{why}: building it from the recipe (demonstrations, then warm-start steps, about 10 minutes on 2 cores)", 0, 0)
    return build_tiny(dest, progress=progress)
