"""Retention: deleting trajectory files whose `date=` partition is older than a cutoff.

Belongs here: parsing ages ("30d", "12h", "90m"), the garbage collection pass over any
`TrajectoryStore`, and removing temp files that killed writers left in the staging directory.
A partition `date=D` holds trajectories started during day D (UTC); it is removed only once the
whole day lies before the cutoff. Files without a parsable `date=` are left alone and reported.
Not here: which age the CLI uses (`data.retention_days`) or writing files (`writer.py`).
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from agentrl_cli.runtime.data.store import TrajectoryStore

_AGE = re.compile(r"\s*(\d+)\s*([dhm])\s*")
_UNITS = {"d": "days", "h": "hours", "m": "minutes"}


def parse_age(text: str) -> dt.timedelta:
    """"30d" → 30 days, "12h" → 12 hours, "90m" → 90 minutes; ValueError for anything else."""
    m = _AGE.fullmatch(text or "")
    if not m or int(m.group(1)) <= 0:
        raise ValueError(f"invalid age {text!r}: use a positive whole number followed by d (days), h (hours) "
                         "or m (minutes), e.g. 30d, 12h, 90m")
    return dt.timedelta(**{_UNITS[m.group(2)]: int(m.group(1))})


def _partition_date(key: str) -> dt.date | None | str:
    """The key's `date=` partition as a date; None if it has none; the raw text if it does not parse."""
    for part in key.split("/"):
        if part.startswith("date="):
            raw = part[len("date="):]
            try:
                return dt.date.fromisoformat(raw) if re.fullmatch(r"\d{4}-\d{2}-\d{2}", raw) else raw
            except ValueError:
                return raw
    return None


def collect_garbage(store: TrajectoryStore, older_than: dt.timedelta | str, now: dt.datetime | None = None,
                    dry_run: bool = False) -> dict[str, Any]:
    """Delete (or with `dry_run` only list) files in `date=` partitions that ended before now - older_than.

    Returns {"cutoff", "dry_run", "deleted": [keys], "bytes": n, "kept": n,
    "skipped": [{"key", "reason"}]} — `deleted` lists what was (or would be) removed."""
    age = parse_age(older_than) if isinstance(older_than, str) else older_than
    now = now or dt.datetime.now(dt.timezone.utc)
    if now.tzinfo is None:
        raise ValueError("collect_garbage: `now` must be timezone-aware (UTC)")
    cutoff = now - age
    report: dict[str, Any] = {"cutoff": cutoff.isoformat(), "dry_run": dry_run, "deleted": [], "bytes": 0,
                              "kept": 0, "skipped": []}
    for info in store.list():
        day = _partition_date(info.key)
        if day is None:
            report["skipped"].append({"key": info.key, "reason": "no date= partition in the key"})
            continue
        if isinstance(day, str):
            report["skipped"].append({"key": info.key, "reason": f"date={day!r} is not YYYY-MM-DD"})
            continue
        day_end = dt.datetime.combine(day + dt.timedelta(days=1), dt.time(), tzinfo=dt.timezone.utc)
        if day_end > cutoff:
            report["kept"] += 1
            continue
        if not dry_run:
            store.delete(info.key)
        report["deleted"].append(info.key)
        report["bytes"] += info.size
    return report


def remove_stale_temp_files(store: TrajectoryStore, older_than: dt.timedelta = dt.timedelta(hours=1),
                            now: dt.datetime | None = None, dry_run: bool = False) -> list[str]:
    """Delete temp files a killed writer left in `store.staging_dir` (never published, so never read).

    Only files last modified before now - older_than go, so a live writer's temp file is safe as long
    as `older_than` exceeds the time one Parquet file takes to write. Returns the paths removed."""
    now = now or dt.datetime.now(dt.timezone.utc)
    cutoff = (now - older_than).timestamp()
    removed = []
    staging = store.staging_dir
    for path in sorted(staging.glob("*.tmp")) if staging.is_dir() else ():
        try:
            if path.is_file() and path.stat().st_mtime < cutoff:
                if not dry_run:
                    path.unlink()
                removed.append(str(path))
        except FileNotFoundError:  # its writer finished meanwhile
            continue
    return removed
