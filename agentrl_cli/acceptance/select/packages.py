"""Criteria 7 and 8 from what is installed, never the network:

- dependencies and licences: the packages a backend's root package needs (`ops/image/lock.py`'s closure
  over the installed distributions), with the versions and licences the image lock records
  (`image.lock_file` when it exists, else the lock of this environment, marked not pinned), how many
  come on top of torch, and every licence outside `image.allowed_licences`;
- maintenance: the root package's installed metadata: its version (a final release or not), its
  development-status classifier, the source revision its build records where it records one, its
  issue tracker, and the date it was installed here. Installed metadata carries no release date, so
  the version's age is not known here and is said to be unknown.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from agentrl_cli.core import parts

BACKEND_ROOTS = {p.name: list(p.packages) for p in parts.BACKENDS}  # the package each backend's engine comes from
MIN_STATUS = 4  # Development Status :: 4 - Beta


def roots_of(backend: str) -> list[str]:
    return BACKEND_ROOTS.get(backend, [])


def lock_for(cfg) -> tuple[dict, str]:
    """(the image lock, where it came from)."""
    from agentrl_cli.ops.image.lock import LockError, build_lock, read_lock

    path = Path(cfg.image.lock_file)
    if path.exists():
        try:
            return read_lock(path), f"the image lock {path}"
        except LockError as exc:
            source = f"this environment (the lock {path} did not read: {exc.message})"
    else:
        source = f"this environment (no lock file at {path}: not pinned; `agentrl image lock` pins it)"
    return build_lock(cfg.image, cfg.inference.engine, cfg.cluster.base_image), source


def dependencies(backend: str, cfg) -> dict:
    from agentrl_cli.ops.image.lock import closure, installed, licence_allowed, normalize

    roots = roots_of(backend)
    dists = installed()
    names, missing = closure(roots, dists)
    torch_names, _ = closure(["torch"], dists)
    lock, source = lock_for(cfg)
    locked = {normalize(n): p for body in lock["roles"].values() for n, p in body["packages"].items()}
    overrides = {normalize(k): v for k, v in cfg.image.licence_overrides.items()}
    licences: dict[str, str] = {}
    for n in sorted(names):
        entry = locked.get(n)
        licences[dists[n].name] = (entry or {}).get("licence") or overrides.get(n) or dists[n].licence
    outside = {n: lic for n, lic in licences.items() if not licence_allowed(lic or "UNKNOWN", cfg.image.allowed_licences)}
    counts: dict[str, int] = {}
    for lic in licences.values():
        counts[lic] = counts.get(lic, 0) + 1
    return {"roots": roots, "missing": missing, "packages": len(names), "beyond_torch": len(names - torch_names),
            "not_in_lock": sorted(dists[n].name for n in names if n not in locked), "licences": counts,
            "outside_allowed": outside, "source": source}


def maintenance(backend: str) -> dict:
    from packaging.version import InvalidVersion, Version

    out = {}
    for root in roots_of(backend):
        try:
            dist = metadata.distribution(root)
        except metadata.PackageNotFoundError:
            out[root] = {"installed": False}
            continue
        m = dist.metadata
        version = m.get("Version") or dist.version
        try:
            final = not (Version(version).is_prerelease or Version(version).is_devrelease)
        except InvalidVersion:
            final = False
        status = [c.split("::")[-1].strip() for c in (m.get_all("Classifier") or []) if c.startswith("Development Status")]
        urls = dict(u.split(",", 1) for u in (m.get_all("Project-URL") or []) if "," in u)
        tracker = next((v.strip() for k, v in urls.items() if re.search(r"issue|bug|tracker", k, re.I)), None)
        source = next((v.strip() for k, v in urls.items() if re.search(r"source|repository|code", k, re.I)), None)
        out[root] = {"installed": True, "version": version, "final_release": final,
                     "development_status": status[0] if status else None, "source_revision": _revision(root, dist),
                     "issue_tracker": tracker, "source": source, "installed_at": _installed_at(dist),
                     "release_date": None}
    return out


def status_level(text: str | None) -> int | None:
    m = re.match(r"\s*(\d+)", text or "")
    return int(m.group(1)) if m else None


def _installed_at(dist) -> str | None:
    meta = next((f for f in (dist.files or []) if f.name == "METADATA"), None)
    if meta is None:
        return None
    try:
        mtime = Path(dist.locate_file(meta)).stat().st_mtime
    except OSError:
        return None
    return datetime.fromtimestamp(mtime, timezone.utc).date().isoformat()


REVISION_FILES = {"torch": "torch/version.py", "deepspeed": "deepspeed/git_version_info_installed.py"}


def _revision(root: str, dist) -> str | None:
    """The source revision a build records in its files, where it records one (torch's
    `version.py: git_version`, DeepSpeed's `git_version_info_installed.py: git_hash`)."""
    rel = REVISION_FILES.get(root)
    if rel is not None:
        path = Path(dist.locate_file(rel))
        if path.is_file():
            m = re.search(r"^(?:git_version|git_hash)\s*=\s*'([^']*)'", path.read_text(encoding="utf-8"), re.M)
            if m and m.group(1) not in ("", "unknown"):
                return m.group(1)
    return None
