"""Carrying the GPU check (`gpu_check.py`) to a machine that has no network: `pack` builds here the
wheels it needs there, `install` installs them there offline. Both run through `gpu_check.py`
(`--pack DIR`, `--install DIR`).

What is carried: agentrl itself (`pip wheel --no-deps` of this checkout) and every package the
check's parts import, at the versions installed here (known to work with this checkout), with the
dependencies they pull in, less what the target surely has: PyTorch, transformers and peft
(`PROVIDED`), what every version of those requires (`PROVIDED_DEPS`: numpy, tokenizers, ...), and
whatever `--target-has` names. `install` installs agentrl, then the parts' roots unpinned
(requirements.txt) from the pack alone: a package the target already has at a version that
satisfies them is left as it is, so a carried wheel may go unused. Each part's roots are in `PARTS`; they were read off the modules that the parts' processes
import (the check, the embedded server, `agentrl stage run 0` and `8`), leaving out what they import
only when it happens to be installed (mlflow through DeepSpeed, boto3 through accelerate,
OpenTelemetry through fastapi). Versions and dependency lists come from this environment's
installed metadata, markers evaluated for the target's Python (`--python-version`). Binary wheels
are fetched for that Python on manylinux x86-64; DeepSpeed publishes only a source archive, so it
is built here without its compiled ops (they are JIT-compiled on first use, and the check uses
none). The built-in model, when it is built here, travels too (a few MB), for the stage runs.

The carry limit is 64 MiB (`LIMIT_MIB`): `pack` prints the total and fails, naming the largest
wheels, when the pack is over it. On a bare target the stage runs do not fit: pyarrow alone is about
52 MiB and matplotlib with its dependencies about 26 MiB; pack `--pack-parts core`, or name what the
target has with `--target-has` (the device image of this workplace has both: `--target-has
cuda-image`).

Not here: what the check measures (`gpu_check.py`, `gpu_parts.py`).
"""

from __future__ import annotations

import importlib.metadata as md
import json
import shutil
import subprocess
import sys
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
LIMIT_MIB = 64.0
PROVIDED = ("torch", "transformers", "peft")
# what those require in every version, so whatever versions the target has: never carried
PROVIDED_DEPS = ("numpy", "packaging", "pyyaml", "filelock", "typing-extensions", "sympy", "networkx", "jinja2", "markupsafe",
                 "mpmath", "fsspec", "huggingface-hub", "tokenizers", "safetensors", "regex", "tqdm", "psutil", "accelerate")
PARTS = {
    # the engine, the DeepSpeed and FSDP steps, the weight transfer and its server process (`agentrl serve inference`)
    "core": ("deepspeed", "pydantic", "PyYAML", "typer", "rich", "fastapi", "uvicorn", "httpx", "aiohttp",
             "prometheus-client", "psutil", "packaging", "safetensors", "rapidfuzz", "jsonschema"),
    # `agentrl stage run 0` and `8`: the trajectory store (Parquet) and the run report's figures
    "stages": ("pyarrow", "matplotlib"),
}
# packages this workplace's lent device image ('cuda') was read to hold, beside PROVIDED (2026-11-17)
TARGETS = {"cuda-image": ("pyarrow", "matplotlib", "aiohttp", "httpx", "rich", "typer", "prometheus-client", "psutil",
                          "msgpack", "py-cpuinfo", "ninja", "nvidia-ml-py", "einops", "pyyaml", "packaging", "numpy",
                          "accelerate", "jinja2", "pillow", "requests", "tqdm", "safetensors")}
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")
SOURCE_ONLY = {"deepspeed"}  # no wheel on PyPI: built here


class PackError(RuntimeError):
    """The pack cannot be made, or does not fit; the message says why and what to do."""


def _environment(python_version: str) -> dict[str, str]:
    return {"python_version": python_version, "python_full_version": f"{python_version}.0", "sys_platform": "linux",
            "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
            "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}


def closure(roots, python_version: str, stop: set[str] = frozenset()) -> dict[str, str]:
    """Canonical name -> version installed here, of `roots` and everything they require (extras not
    taken), not walking into names in `stop`. A root or dependency not installed here raises PackError."""
    env, found, todo = _environment(python_version), {}, [canonicalize_name(r) for r in roots]
    while todo:
        name = todo.pop()
        if name in found or name in stop:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            raise PackError(f"{name} is not installed here, so its version and dependencies are unknown; "
                            "run the pack from agentrl's environment (pip install -e .)") from None
        found[name] = dist.version
        for text in dist.requires or ():
            req = Requirement(text)
            if req.marker is None or Marker(str(req.marker)).evaluate(env):
                todo.append(canonicalize_name(req.name))
    return found


def plan(parts: list[str], target_has: list[str], python_version: str) -> tuple[list[str], dict[str, str]]:
    """(the roots `install` installs, the wheels to carry: name -> version): `parts`' roots and what they
    require, less PROVIDED, what every version of those requires (PROVIDED_DEPS) and what the target has."""
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise PackError(f"unknown part(s) {unknown}; the parts are {', '.join(PARTS)}")
    has = [n for item in target_has for n in TARGETS.get(item, (item,))]
    stop = {canonicalize_name(n) for n in (*PROVIDED, *PROVIDED_DEPS, *has)}
    roots = [canonicalize_name(r) for p in parts for r in PARTS[p] if canonicalize_name(r) not in stop]
    return roots, dict(sorted(closure(roots, python_version, stop).items()))


def _pip(*args: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise PackError(f"pip {' '.join(args[:3])} ... failed:\n{(proc.stderr or proc.stdout)[-1500:]}")


def fetch(name: str, version: str, dest: Path, python_version: str) -> None:
    """One wheel of `name==version` for the target into `dest`: a binary (or pure) wheel from the index,
    else (a source-only package) one built here, refused when it is not pure Python."""
    spec = f"{name}=={version}"
    if name not in SOURCE_ONLY:
        platforms = [a for p in PLATFORMS for a in ("--platform", p)]
        try:
            _pip("download", "--no-deps", "--only-binary=:all:", "--python-version", python_version, "--implementation", "cp",
                 *platforms, "-d", str(dest), "-q", spec)
            return
        except PackError:
            pass  # no wheel for the target: build one below if it is pure Python
    before = set(dest.iterdir())
    _pip("wheel", "--no-deps", "-w", str(dest), "-q", spec)
    built = [p for p in set(dest.iterdir()) - before if p.suffix == ".whl"]
    impure = [p.name for p in built if not p.name.endswith("-py3-none-any.whl")]
    if impure:
        for p in built:
            p.unlink()
        raise PackError(f"{spec} has no wheel for Python {python_version} on manylinux x86-64 and builds only for this "
                        f"machine ({', '.join(impure)}); name it in --target-has if the target has it")


def pack(dest: Path, parts: list[str], target_has: list[str], python_version: str, say=print) -> dict:
    """Fill `dest` (made empty first) with the wheels, requirements.txt (what `install` installs),
    the built-in model when built here, and manifest.json; returns the manifest. PackError when over LIMIT_MIB."""
    roots, wanted = plan(parts, target_has, python_version)
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    say(f"building the agentrl wheel from {ROOT}")
    _pip("wheel", "--no-deps", "-w", str(dest), "-q", str(ROOT))
    for name, version in wanted.items():
        say(f"fetching {name}=={version}")
        fetch(name, version, dest, python_version)
    # the roots unpinned: what the target already has at a version that satisfies them stays as it is
    (dest / "requirements.txt").write_text("".join(f"{n}\n" for n in roots))
    model = _builtin_model()
    if model is not None:
        shutil.copytree(model, dest / "model" / model.name)
    files = sorted((p for p in dest.rglob("*") if p.is_file()), key=lambda p: -p.stat().st_size)
    total = sum(p.stat().st_size for p in files) / 2**20
    manifest = {"parts": parts, "target_has": target_has, "python_version": python_version, "roots": roots, "wheels": wanted,
                "builtin_model": model.name if model is not None else None, "total_mib": round(total, 2),
                "limit_mib": LIMIT_MIB}
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    say(f"pack {dest}: {len(files)} files, {total:.1f} MiB (limit {LIMIT_MIB:g} MiB)")
    if total > LIMIT_MIB:
        largest = ", ".join(f"{p.name} {p.stat().st_size / 2**20:.1f} MiB" for p in files[:4])
        raise PackError(f"the pack is {total:.1f} MiB, over the {LIMIT_MIB:g} MiB carry limit; largest: {largest}. "
                        "Pack fewer parts (--pack-parts core leaves the stage runs out) or name what the target already has "
                        f"(--target-has NAME,..., or {', '.join(TARGETS)})")
    return manifest


def _builtin_model() -> Path | None:
    """The built-in model's directory when it is built here (it is not built by packing)."""
    try:
        from agentrl_cli.config import load_config
        from agentrl_cli.model.resolve import resolve_model_path

        cfg = load_config(None, [], env={}).config
        return Path(resolve_model_path(cfg.model.path, cfg.model.cache_dir, build=False))
    except Exception:  # noqa: BLE001 - not built (or not resolvable): the stage runs use a random model there
        return None


def install(src: Path, say=print) -> None:
    """On the target: agentrl's wheel without its dependency list (most of it is not needed by the
    check), then requirements.txt's packages from `src` alone; nothing is fetched."""
    wheels = sorted(src.glob("agentrl_cli-*.whl"))
    if not wheels or not (src / "requirements.txt").is_file():
        raise PackError(f"{src} holds no agentrl wheel or requirements.txt: make it here with "
                        f"`python benchmarks/gpu_check.py --pack {src}`")
    base = ["install", "--no-index", "--find-links", str(src), "--no-cache-dir", "--disable-pip-version-check", "-q"]
    roots = (src / "requirements.txt").read_text().split()
    say(f"installing {wheels[-1].name} and {', '.join(roots) or 'nothing else'} (what is missing of them and their needs) from {src}")
    _pip(*base, "--no-deps", str(wheels[-1]))
    if roots:
        _pip(*base, "-r", str(src / "requirements.txt"))
    say("installed")


def carried_model(src: Path | None) -> Path | None:
    """The built-in model a pack carried (`src/model/<name>`), if any."""
    if src is None or not (src / "model").is_dir():
        return None
    found = [p for p in (src / "model").iterdir() if (p / "config.json").is_file()]
    return found[0] if found else None
