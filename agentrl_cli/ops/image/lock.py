"""The image lock: exact versions and licences per role, read from the resolved environment.

A role (base, train, inference, env; `image.roles`) is a list of root packages; its lock is every
installed distribution those roots need (requirements followed with their markers evaluated here,
extras not followed), plus the base role's. Each package carries its version and its licence:
the PEP 639 `License-Expression`, else a short `License` field, else the licence classifiers,
normalised to SPDX ids. The lock also pins Python and torch's build (CUDA/ROCm or CPU), read from
files without importing torch. Environment images (`harnesses[].image`) are pinned beside the roles
by their digests (`environment_images`, see `env_images.py`). Its digest (over everything but the
creation time) names the images.
Belongs here: building, reading, writing and judging the lock; comparing it with a running
environment is `acceptance/verify.py`, Dockerfiles are `render.py`.
"""

from __future__ import annotations

import fnmatch
import hashlib
import importlib.util
import json
import platform
import re
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import lru_cache
from importlib import metadata
from pathlib import Path

from agentrl_cli.core.errors import AgentrlError
from agentrl_cli.core.report import Check, atomic_write_text
from agentrl_cli.ops.image import env_images

LOCK_SCHEMA = 1
ROLES_ORDER = ("base", "train", "inference", "env", "controlplane")
# free-text licence names and trove classifiers -> SPDX ids
_NAMES = {
    "apache": "Apache-2.0", "apache 2.0": "Apache-2.0", "apache-2.0": "Apache-2.0", "apache license 2.0": "Apache-2.0",
    "apache software license": "Apache-2.0", "apache software license 2.0": "Apache-2.0", "apache 2.0 license": "Apache-2.0",
    "apache license, version 2.0": "Apache-2.0", "apache license version 2.0": "Apache-2.0", "apache2.0": "Apache-2.0",
    "apache 2": "Apache-2.0", "apache2": "Apache-2.0", "apache-2": "Apache-2.0",
    "mit": "MIT", "mit license": "MIT", "bsd": "BSD", "bsd license": "BSD", "new bsd license": "BSD-3-Clause",
    "bsd-3-clause": "BSD-3-Clause", "bsd-2-clause": "BSD-2-Clause", "3-clause bsd license": "BSD-3-Clause",
    "isc": "ISC", "isc license": "ISC", "isc license (iscl)": "ISC", "psf": "PSF-2.0", "psf-2.0": "PSF-2.0",
    "python software foundation license": "PSF-2.0", "mozilla public license 2.0 (mpl 2.0)": "MPL-2.0", "mpl-2.0": "MPL-2.0",
    "mpl 2.0": "MPL-2.0", "academic free license (afl)": "AFL", "the unlicense (unlicense)": "Unlicense",
    "zlib/libpng license": "Zlib", "gnu lesser general public license v3 (lgplv3)": "LGPL-3.0",
    "gnu lesser general public license v2 or later (lgplv2+)": "LGPL-2.0-or-later",
    "gnu general public license v3 (gplv3)": "GPL-3.0", "gnu general public license v2 (gplv2)": "GPL-2.0",
    "gnu affero general public license v3": "AGPL-3.0", "public domain": "Unlicense",
}


class LockError(AgentrlError):
    """The lock file is missing, malformed or cannot be made from this environment."""


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Dist:
    """One installed distribution, its metadata parsed once."""

    name: str
    version: str
    requires: tuple[str, ...]
    licence: str


def installed() -> dict[str, Dist]:
    """Normalised name -> distribution, for everything importable by this interpreter."""
    out: dict[str, Dist] = {}
    for d in metadata.distributions():
        m = d.metadata
        name = m.get("Name")
        if name and normalize(name) not in out:
            out[normalize(name)] = Dist(name, m.get("Version") or d.version, tuple(m.get_all("Requires-Dist") or ()), licence_of(m))
    return out


@lru_cache(maxsize=4096)
def _needed(text: str) -> str | None:
    """The normalised name a `Requires-Dist` line needs here, or None (its marker is false, or it is an extra's)."""
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        req = Requirement(text)
    except InvalidRequirement:
        return None
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        return None
    return normalize(req.name)


def closure(roots: list[str], dists: dict[str, Dist]) -> tuple[set[str], list[str]]:
    """(every installed package the roots need, roots not installed here)."""
    seen: set[str] = set()
    missing = [r for r in roots if normalize(r) not in dists]
    todo = [normalize(r) for r in roots if normalize(r) in dists]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for text in dists[name].requires:
            dep = _needed(text)
            if dep is not None and dep in dists and dep not in seen:
                todo.append(dep)
    return seen, missing


def licence_of(m) -> str:
    """The licence a distribution's metadata (`m`) states, as an SPDX-style expression, or UNKNOWN."""
    expr = (m.get("License-Expression") or "").strip()
    if expr:
        return expr
    text = (m.get("License") or "").strip()
    if text and len(text) <= 60 and "\n" not in text and text.lower() not in ("unknown", "dual license", "other/proprietary license"):
        return _NAMES.get(text.lower(), text)
    classifiers = [c.split("::")[-1].strip() for c in (m.get_all("Classifier") or []) if c.startswith("License ::")]
    ids = [_NAMES.get(c.lower(), c) for c in classifiers if c.lower() not in ("osi approved", "dfsg approved")]
    return " OR ".join(dict.fromkeys(ids)) if ids else "UNKNOWN"


def licence_allowed(expression: str, allowed: list[str]) -> bool:
    """An SPDX-style expression is allowed when one OR-branch has every AND-term allowed
    (`WITH` exceptions ride on their licence; parentheses are flattened)."""
    expr = expression.replace("(", " ").replace(")", " ")
    for branch in re.split(r"\s+OR\s+", expr):
        terms = [re.split(r"\s+WITH\s+", t.strip())[0].strip() for t in re.split(r"\s+AND\s+", branch)]
        if terms and all(t and any(fnmatch.fnmatchcase(t.lower(), a.lower()) for a in allowed) for t in terms):
            return True
    return False


def torch_build() -> dict:
    """torch's version and accelerator build, read from torch/version.py (no import)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return {"version": None, "cuda": None, "hip": None}
    text = (Path(list(spec.submodule_search_locations)[0]) / "version.py").read_text(encoding="utf-8")

    def field(name: str):
        m = re.search(rf"^{name}\s*(?::[^=]*)?=\s*'([^']*)'", text, re.M)
        return m.group(1) if m else None

    return {"version": field("__version__"), "cuda": field("cuda"), "hip": field("hip")}


def role_roots(image_config, inference_engine: str) -> dict[str, list[str]]:
    """`image.roles`, the inference role with the packages the engine (`inference.engine`) adds."""
    from agentrl_cli.engines.registry import engine_named

    roots = {role: list(pkgs) for role, pkgs in image_config.roles.items()}
    if "inference" in roots:
        roots["inference"] += [p for p in engine_named(inference_engine).lock_packages if p not in roots["inference"]]
    return roots


def build_lock(image_config, inference_engine: str = "hf", base_image: str = "", cache_dir: str | None = None,
               env_images: dict[str, dict] | None = None) -> dict:
    """The lock of this environment; with `cache_dir` (model.cache_dir) it lists the engine versions
    that passed the conformance check: pinned ones and those `agentrl engine verify` recorded there;
    with `env_images` (`env_images.pin`) it pins the harnesses' environment images."""
    dists = installed()
    overrides = {normalize(k): v for k, v in image_config.licence_overrides.items()}
    roots = role_roots(image_config, inference_engine)
    base, base_missing = closure(roots.get("base", []), dists)
    roles = {}
    for role in sorted(roots, key=lambda r: (ROLES_ORDER.index(r) if r in ROLES_ORDER else 99, r)):
        names, missing = closure(roots[role], dists)
        names |= base
        packages = {}
        for n in sorted(names):
            d = dists[n]
            packages[d.name] = {"version": d.version, "licence": overrides.get(n) or d.licence}
        roles[role] = {"roots": roots[role], "packages": packages, "missing": sorted(set(missing) | set(base_missing))}
    lock = {"schema_version": LOCK_SCHEMA, "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "python": platform.python_version(), "platform": f"{sys.platform}-{platform.machine()}",
            "torch_build": torch_build(), "base_image": base_image, "roles": roles}
    if cache_dir is not None:
        from agentrl_cli.engines.conformance.record import verified

        lock["verified_engines"] = verified(cache_dir)
    if env_images:
        lock["environment_images"] = env_images
    lock["digest"] = lock_digest(lock)
    return lock


def lock_digest(lock: dict) -> str:
    body = {k: v for k, v in lock.items() if k not in ("created_at", "digest")}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def write_lock(lock: dict, path: Path) -> Path:
    atomic_write_text(Path(path), json.dumps(lock, indent=2, sort_keys=False) + "\n")
    return Path(path)


def read_lock(path: Path, strict_digest: bool = True) -> dict:
    """The lock at `path`, validated; LockError naming what is wrong and the fix. With
    `strict_digest=False` a lock whose content no longer matches its digest is returned (for
    comparing with an environment, see `digest_check`); building from it is refused."""
    path = Path(path)
    fix = f"regenerate it with `agentrl image lock --out {path}`"
    try:
        lock = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise LockError(f"no image lock at {path}", "create it with `agentrl image lock` (or set image.lock_file)") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise LockError(f"image lock {path} is not valid JSON: {exc}", fix) from None
    problems = []
    if not isinstance(lock, dict):
        raise LockError(f"image lock {path} is not a JSON object", fix)
    if lock.get("schema_version") != LOCK_SCHEMA:
        problems.append(f"schema_version is {lock.get('schema_version')!r}, expected {LOCK_SCHEMA}")
    roles = lock.get("roles")
    if not isinstance(roles, dict) or "base" not in roles:
        problems.append("roles must be an object with at least a base role")
    else:
        for role, body in roles.items():
            pk = body.get("packages") if isinstance(body, dict) else None
            if not isinstance(pk, dict) or not all(isinstance(v, dict) and isinstance(v.get("version"), str) for v in pk.values()):
                problems.append(f"roles.{role}.packages must map names to {{version, licence}}")
    if not isinstance(lock.get("python"), str):
        problems.append("python must be a version string")
    problems += env_images.malformed(lock)
    if problems:
        raise LockError(f"image lock {path} is malformed: {'; '.join(problems)}", fix)
    if strict_digest and lock.get("digest") != lock_digest(lock):
        raise LockError(f"image lock {path} was edited by hand: its digest does not match its content", fix)
    return lock


def image_tags(lock: dict, registry: str) -> dict[str, str]:
    """role -> image tag: the base from Python and torch, roles from agentrl's version; all end in the digest."""
    registry, short = registry.rstrip("/"), lock["digest"][:12]
    torch_v = (lock.get("torch_build") or {}).get("version") or "none"
    tags = {"base": f"{registry}/agentrl-base:py{lock['python']}-torch{torch_v.replace('+', '-')}-{short}"}
    version = next((p["version"] for r in lock["roles"].values() for n, p in r["packages"].items() if normalize(n) == "agentrl-cli"),
                   "0")
    for role in lock["roles"]:
        if role != "base":
            tags[role] = f"{registry}/agentrl-{role}:{version}-{short}"
    return tags


def summary(lock: dict, path: str | None, registry: str) -> dict:
    """What a run's meta.json records about the image lock."""
    return {"file": path, "digest": lock["digest"], "python": lock["python"], "torch_build": lock.get("torch_build"),
            "packages": {role: len(body["packages"]) for role, body in lock["roles"].items()},
            "tags": image_tags(lock, registry), "environment_images": lock.get("environment_images", {})}


def lock_checks(lock: dict, allowed: list[str]) -> list[Check]:
    """Every role's roots present, and every package's licence within `allowed`."""
    missing = {role: body.get("missing", []) for role, body in lock["roles"].items() if body.get("missing")}
    counts = {role: len(body["packages"]) for role, body in lock["roles"].items()}
    out = [Check.judge("lock complete", not missing, {"packages": counts, "digest": lock["digest"][:12]},
                       "every role's packages installed and pinned",
                       "install the missing packages where that role runs and lock there (`agentrl image lock`), or "
                       "remove them from image.roles", f"not installed: {missing}" if missing else "")]
    bad: dict[str, str] = {}
    for body in lock["roles"].values():
        for name, p in body["packages"].items():
            if not licence_allowed(p.get("licence") or "UNKNOWN", allowed):
                bad[name] = p.get("licence") or "UNKNOWN"
    out.append(Check.judge("licences allowed", not bad, {"packages": len({n for b in lock["roles"].values() for n in b["packages"]}),
                                                         "outside": bad},
                           "every locked package's licence within image.allowed_licences",
                           "read the named packages' licence terms; then allow the licence (image.allowed_licences), record it "
                           "(image.licence_overrides) or drop the package",
                           "; ".join(f"{n}: {lic}" for n, lic in sorted(bad.items()))))
    return out


def run_record(config) -> dict:
    """The image lock as a run's meta.json records it: `image.lock_file` when it exists (or why it
    cannot be read), else the lock of the running environment, marked as not pinned."""
    path = Path(config.image.lock_file)
    registry = config.cluster.image_registry
    if path.exists():
        try:
            return summary(read_lock(path), str(path), registry)
        except LockError as exc:
            return {"file": str(path), "error": exc.message}
    lock = build_lock(config.image, config.inference.engine, config.cluster.base_image)
    return {**summary(lock, None, registry), "pinned": False}


def digest_check(lock: dict) -> Check:
    actual = lock_digest(lock)
    return Check.judge("lock digest matches its content", lock.get("digest") == actual,
                       {"recorded": str(lock.get("digest"))[:12], "computed": actual[:12]},
                       "the lock is as `agentrl image lock` wrote it",
                       "the lock was edited after it was written: regenerate it with `agentrl image lock` where the role runs")
