"""Which engine versions passed the conformance check: the pinned ones CI verifies (`VERIFIED`), and
those a user verified here with `agentrl engine verify` (recorded in
`<model.cache_dir>/engines/verified.json`); and the checks stage 4 and `agentrl engine verify` show.

Belongs here: the record, and turning a result or a version into a report check. Does not: running
the probe (`check.py`), reading the engine's code (`probe/`)."""

from __future__ import annotations

import json
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from agentrl_cli.core.report import Check, CheckStatus
from agentrl_cli.engines.conformance import VERIFIED

CONFORMANCE = "engine conforms to its own code"
VERSION = "engine version verified"


def record_path(cache_dir: str | Path) -> Path:
    return Path(cache_dir).expanduser() / "engines" / "verified.json"


def passes(cache_dir: str | Path) -> list[dict]:
    """The recorded passes (engine, version, python, paths, at), oldest first; [] when none."""
    try:
        data = json.loads(record_path(cache_dir).read_text())
    except (OSError, ValueError):
        return []
    return [p for p in data.get("passes", []) if isinstance(p, dict)] if isinstance(data, dict) else []


def record_pass(result, cache_dir: str | Path) -> Path:
    """Add a passing `result` (check.Conformance) to the record, atomically."""
    path = record_path(cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    kept = [p for p in passes(cache_dir) if (p.get("engine"), p.get("version")) != (result.engine, result.version)]
    kept.append({"engine": result.engine, "version": result.version, "python": result.python, "paths": result.paths,
                 "at": datetime.now(timezone.utc).isoformat(timespec="seconds")})
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".verified-")
    with os.fdopen(fd, "w") as f:
        json.dump({"passes": kept}, f, indent=1)
    os.replace(tmp, path)
    return path


def verified(cache_dir: str | Path) -> dict[str, list[str]]:
    """engine -> the versions that passed: the pinned one (CI) first, then those recorded here."""
    out = {name: [version] for name, version in VERIFIED.items()}
    for p in passes(cache_dir):
        versions = out.setdefault(str(p.get("engine")), [])
        if p.get("version") and p["version"] not in versions:
            versions.append(p["version"])
    return out


def how_to_verify(engine: str, python: str) -> str:
    return f"agentrl engine verify --engine {engine} --python {python}"


def version_check(engine: str, version: str, python: str, cache_dir: str | Path) -> Check:
    """pass for a version that passed (pinned or recorded); for one that never did, skip (whether it
    conforms is not known; `--strict` turns it into a failure), naming it and how to verify it."""
    known = verified(cache_dir).get(engine, [])
    if version in known:
        source = "pinned and verified in CI" if VERIFIED.get(engine) == version else f"verified here ({record_path(cache_dir)})"
        return Check(VERSION, CheckStatus.PASS, {"engine": engine, "version": version}, f"{engine} {version}: {source}")
    return Check(VERSION, CheckStatus.SKIP, {"engine": engine, "version": version, "verified": known},
                 f"a version that passed the conformance check ({', '.join(known) or 'none'})",
                 f"{engine} {version} has never passed the conformance check: agentrl's requests may not be the ones "
                 "this version takes", how_to_verify(engine, python))


def conformance_check(result) -> Check:
    """The probe's result as a check: pass, or fail naming each problem and where the engine defines it."""
    measured = {"engine": result.engine, "version": result.version, "items": len(result.items), "read": result.paths}
    if result.passed:
        return Check(CONFORMANCE, CheckStatus.PASS, measured,
                     "the launch argv, routes, request bodies and fields read all match the engine's own code")
    lines = [f"{p.get('what') or p.get('kind')}: {p['problem']} ({p.get('where') or 'where unknown'})" for p in result.problems]
    return Check(CONFORMANCE, CheckStatus.FAIL, {**measured, "problems": lines}, "no problem",
                 "; ".join(lines[:5]) + ("; ..." if len(lines) > 5 else ""),
                 "agentrl's client and this engine version disagree: use a verified version (docs/engines.md "
                 "'Verified engine versions') or report the problems")
