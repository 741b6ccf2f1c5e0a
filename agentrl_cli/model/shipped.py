"""The built-in model as shipped: the weights `build_tiny` made from this recipe, in the package
(`agentrl_cli/model/weights/tiny-agent-r<RECIPE_VERSION>/`, 3.5 MB), so a first run installs them into
`model.cache_dir` in a second instead of building them for several minutes.

The shipped directory is an ordinary built model directory (its `agentrl.json` is the build record:
recipe, demonstrations, SFT losses, seconds) with a `SHA256SUMS` of its files. It is used only when
it is this recipe's (`RECIPE_VERSION`) and every file checks out; otherwise the model is built as
before, and the reason is shown. The installed copy's card says where it came from (`installed`),
and `agentrl model build-tiny --force` rebuilds it here from the recipe. A test keeps the shipped
copy in step with the recipe (architecture, tokenizer, chat template, recipe constants); after a
recipe change, rebuild the shipped copy: `python -m agentrl_cli.model.shipped` (about 10 minutes on
2 cores)."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import shutil
import tempfile
from pathlib import Path

from agentrl_cli.model.tiny import COMPLETE, RECIPE_VERSION, replacing_dir

WEIGHTS = Path(__file__).parent / "weights"
SUMS = "SHA256SUMS"


def shipped_dir() -> Path:
    return WEIGHTS / f"tiny-agent-r{RECIPE_VERSION}"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def problem(source: Path | None = None) -> str | None:
    """Why the shipped copy cannot be installed (None: it can): missing, another recipe's, or a file
    that does not match its checksum (a truncated install, a Git LFS pointer)."""
    source = source or shipped_dir()
    sums = source / SUMS
    if not sums.is_file():
        return f"no shipped built-in model for recipe {RECIPE_VERSION} ({sums} missing)"
    for line in sums.read_text().splitlines():
        digest, name = line.split(None, 1)
        if not (source / name).is_file():
            return f"the shipped built-in model lacks {name}"
        if _sha256(source / name) != digest:
            return f"the shipped built-in model's {name} does not match its checksum"
    try:
        built = json.loads((source / COMPLETE).read_text())
    except (OSError, ValueError) as exc:
        return f"the shipped built-in model's {COMPLETE} does not read: {exc}"
    if built.get("recipe_version") != RECIPE_VERSION:
        return f"the shipped built-in model is recipe {built.get('recipe_version')}, this agentrl's is {RECIPE_VERSION}"
    return None


def install(dest: Path, source: Path | None = None) -> Path:
    """Copy the shipped model to `dest` (a temporary directory beside it, then a rename: never half
    there), its card saying it was installed from the package. Raises ValueError naming the
    `problem` when it cannot be used."""
    source = source or shipped_dir()
    why = problem(source)
    if why is not None:
        raise ValueError(why)
    dest = Path(dest)
    with replacing_dir(dest) as tmp:
        for f in source.iterdir():
            if f.name != SUMS:
                shutil.copyfile(f, tmp / f.name)
        card = json.loads((tmp / COMPLETE).read_text())
        card["installed"] = {"from": "shipped with the agentrl package (agentrl_cli/model/weights)",
                             "at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                             "rebuild": "agentrl model build-tiny --force"}
        (tmp / COMPLETE).write_text(json.dumps(card, indent=2) + "\n")
    return dest


def ship(built: Path, target: Path | None = None, **shipped: str | None) -> Path:
    """Make `built` (a model directory `build_tiny` wrote) the shipped copy: its files, its card's
    `shipped` record (when, from which commit: `shipped` adds to it) and their SHA256SUMS."""
    target = target or shipped_dir()
    names = sorted(f.name for f in Path(built).iterdir() if f.is_file() and f.name != SUMS)
    if Path(built).resolve() != target.resolve():
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        for name in names:
            shutil.copyfile(Path(built) / name, target / name)
    card = json.loads((target / COMPLETE).read_text())
    card["shipped"] = {"built_on": dt.date.today().isoformat(), "how": "python -m agentrl_cli.model.shipped "
                       "(build_tiny from the recipe, seed 0)", **card.get("shipped", {}), **shipped}
    (target / COMPLETE).write_text(json.dumps(card, indent=2) + "\n")
    (target / SUMS).write_text("".join(f"{_sha256(target / n)}  {n}\n" for n in names))
    return target


if __name__ == "__main__":  # rebuild the shipped copy from the recipe
    import subprocess
    import sys

    from agentrl_cli.model.build import build_tiny

    built = Path(sys.argv[1]) if len(sys.argv) > 1 else None  # a directory build_tiny already wrote
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent)
    commit = head.stdout.strip() or None
    with tempfile.TemporaryDirectory() as work:
        built = built or build_tiny(Path(work) / "tiny-agent", progress=lambda phase, done, total: print(phase, done, total, flush=True))
        print(ship(built, commit=commit))
