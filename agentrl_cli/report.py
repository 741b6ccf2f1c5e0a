"""Check and StageReport: the one result type of every stage, and its JSON, Markdown and rich views.

A stage passes when no check fails. A check that could not run is `skip` with its reason, never
`pass`; `--strict` turns skips into failures. A figure that is reported but not judged is `info`:
it never counts as a pass or a failure, and `--strict` leaves it alone. Every failing check carries
a hint a person can act on. Reports are rendered from one object; the JSON carries
`schema_version` (2 added the `info` status; version 1 reports still read).
"""

from __future__ import annotations

import json
import os
import tempfile
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

SCHEMA_VERSION = 2
READABLE_SCHEMA_VERSIONS = (1, 2)
PASS, FAIL, SKIP, INFO = "pass", "fail", "skip", "info"
STATUSES = (PASS, FAIL, SKIP, INFO)


@dataclass
class Check:
    name: str
    status: str  # "pass" | "fail" | "skip" | "info"
    measured: Any = None
    expected: str = ""
    detail: str = ""
    hint: str = ""  # what to do when it fails

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"check {self.name!r}: status must be one of {STATUSES}, got {self.status!r}")

    @classmethod
    def judge(cls, name: str, ok: bool, measured: Any, expected: str, hint: str, detail: str = "") -> "Check":
        """pass when `ok`, else fail with `hint`."""
        return cls(name, PASS if ok else FAIL, measured, expected, detail, hint)

    @classmethod
    def skipped(cls, name: str, reason: str, expected: str = "", hint: str = "") -> "Check":
        return cls(name, SKIP, None, expected, reason, hint or reason)

    @classmethod
    def info(cls, name: str, measured: Any, detail: str = "", expected: str = "reported, not judged") -> "Check":
        """A figure worth showing that no threshold judges: neither a pass nor a failure."""
        return cls(name, INFO, measured, expected, detail, "")

    @classmethod
    def not_implemented(cls, what: str) -> "Check":
        return cls("not implemented", FAIL, "not built", "implemented", f"not built in this agentrl version; planned checks: {what}",
                   "nothing to fix in your setup: this stage's checks are not built yet "
                   "(the stage table in README.md says what each stage will check)")

    @classmethod
    def crashed(cls, name: str, exc: BaseException) -> "Check":
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return cls(name, FAIL, None, "the check runs to completion", f"{type(exc).__name__}: {exc}\n\n{tb}",
                   "the check raised an exception; the traceback is in this report's JSON (detail) - "
                   "rerun with AGENTRL_DEBUG=1 to see it on the console")


def guarded(name: str, fn: Callable[[], Check]) -> Check:
    """Run one check; an exception becomes a failing check with the traceback, not a crash."""
    try:
        result = fn()
    except Exception as exc:  # noqa: BLE001 - containment is the point
        return Check.crashed(name, exc)
    if not isinstance(result, Check):
        return Check(name, FAIL, repr(result), "a Check", "check function returned no Check", "fix the stage module")
    return result


def stage_status(checks: list[Check]) -> str:
    """fail when any check fails (or there is none); skip when nothing was judged (only skips and
    figures reported); else pass. `info` checks never decide it."""
    if not checks or any(c.status == FAIL for c in checks):
        return FAIL
    if not any(c.status == PASS for c in checks):
        return SKIP
    return PASS


def apply_strict(checks: list[Check]) -> list[Check]:
    out = []
    for c in checks:
        if c.status == SKIP:
            c = Check(c.name, FAIL, c.measured, c.expected, f"skipped under --strict: {c.detail}",
                      c.hint or "run without --strict, or provide what the check needs")
        out.append(c)
    return out


@dataclass
class StageReport:
    stage: int
    title: str
    status: str
    checks: list[Check]
    started_at: str
    duration_s: float
    run_id: str
    config_hash: str
    environment: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {s: sum(c.status == s for c in self.checks) for s in STATUSES}

    def to_dict(self) -> dict:
        d = asdict(self)
        return {"schema_version": SCHEMA_VERSION, **d, "counts": self.counts()}

    @classmethod
    def from_dict(cls, data: dict) -> "StageReport":
        version = data.get("schema_version", 1)
        if version not in READABLE_SCHEMA_VERSIONS:
            raise ValueError(f"report schema_version {version} is not one this agentrl reads ({READABLE_SCHEMA_VERSIONS})")
        fields = {k: data[k] for k in ("stage", "title", "status", "started_at", "duration_s", "run_id", "config_hash")}
        return cls(**fields, checks=[Check(**c) for c in data.get("checks", [])],
                   environment=data.get("environment", {}), notes=data.get("notes", []))

    def to_markdown(self) -> str:
        c = self.counts()
        out = [f"# Stage {self.stage}: {self.title} — {self.status.upper()}", "",
               f"run `{self.run_id}` · config `{self.config_hash}` · started {self.started_at} · "
               f"{self.duration_s:.2f} s · {c[PASS]} pass, {c[FAIL]} fail, {c[SKIP]} skip, {c[INFO]} info", "",
               "| check | status | measured | expected |", "|---|---|---|---|"]
        for ch in self.checks:
            out.append(f"| {_md(ch.name)} | {ch.status} | {_md(format_measured(ch.measured))} | {_md(ch.expected)} |")
        problems = [ch for ch in self.checks if ch.status in (FAIL, SKIP)]
        if problems:
            out += ["", "## Failures and skips", ""]
            for ch in problems:
                first = ch.detail.splitlines()[0] if ch.detail else ""
                out.append(f"- **{ch.name}** ({ch.status}): {first}")
                if ch.hint:
                    out.append(f"  - what to do: {ch.hint}")
        reported = [ch for ch in self.checks if ch.status == INFO and ch.detail]
        if reported:
            out += ["", "## Reported, not judged", ""] + [f"- **{ch.name}**: {ch.detail.splitlines()[0]}" for ch in reported]
        long = [ch for ch in self.checks if ch.detail.count("\n") > 1]
        if long:
            out += ["", "## Details", ""]
            for ch in long:
                out += [f"### {ch.name}", "", "```", ch.detail.rstrip(), "```", ""]
        if self.notes:
            out += ["", "## Notes", ""] + [f"- {n}" for n in self.notes]
        return "\n".join(out) + "\n"


def format_measured(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (dict, list)):
        text = json.dumps(value, default=str)
        return text if len(text) <= 80 else text[:77] + "..."
    return str(value)


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def atomic_write_text(path: Path, text: str) -> None:
    """Write to a temp file in the same directory, fsync, then rename over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_report(report: StageReport, reports_dir: Path, name: str | None = None) -> tuple[Path, Path]:
    name = name or f"stage-{report.stage}"
    json_path, md_path = reports_dir / f"{name}.json", reports_dir / f"{name}.md"
    atomic_write_text(json_path, json.dumps(report.to_dict(), indent=2, default=str) + "\n")
    atomic_write_text(md_path, report.to_markdown())
    return json_path, md_path


def read_report(path: Path) -> StageReport:
    return StageReport.from_dict(json.loads(path.read_text(encoding="utf-8")))
