"""Check and StageReport: the one result type of every stage, and its JSON and Markdown views.

A stage passes when no check fails. A check that could not run is `skip` with its reason, never
`pass`; `--strict` turns skips into failures. A figure that is reported but not judged is `info`:
it never counts as a pass or a failure, and `--strict` leaves it alone. Every failing check carries
a hint a person can act on. Reports are rendered from one object; the JSON carries
`schema_version` (2 added the `info` status; version 1 reports still read).

Belongs here: the result type, its statuses (`CheckStatus`), the rules that join them into a
stage's status, and the JSON and Markdown writers. The console view is `cli/render.py`.
"""

from __future__ import annotations

import json
import os
import tempfile
import traceback
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Callable

SCHEMA_VERSION = 2
READABLE_SCHEMA_VERSIONS = (1, 2)


class CheckStatus(StrEnum):
    """What a check found. Members are `str`: they compare equal to, and serialize as, their values."""

    PASS = "pass"
    FAIL = "fail"
    SKIP = "skip"  # could not run; the detail says why
    INFO = "info"  # a figure reported, never judged


PASS, FAIL, SKIP, INFO = CheckStatus  # the names stage modules written before CheckStatus import
STATUSES = tuple(CheckStatus)


@dataclass
class Check:
    name: str
    status: CheckStatus  # a plain string ("pass") is read as its member
    measured: Any = None
    expected: str = ""
    detail: str = ""
    hint: str = ""  # what to do when it fails

    def __post_init__(self) -> None:
        try:
            self.status = CheckStatus(self.status)
        except ValueError:
            raise ValueError(f"check {self.name!r}: status must be one of {tuple(s.value for s in CheckStatus)}, "
                             f"got {self.status!r}") from None

    @classmethod
    def judge(cls, name: str, ok: bool, measured: Any, expected: str, hint: str, detail: str = "") -> "Check":
        """pass when `ok`, else fail with `hint`."""
        return cls(name, CheckStatus.PASS if ok else CheckStatus.FAIL, measured, expected, detail, hint)

    @classmethod
    def skipped(cls, name: str, reason: str, expected: str = "", hint: str = "") -> "Check":
        return cls(name, CheckStatus.SKIP, None, expected, reason, hint or reason)

    @classmethod
    def info(cls, name: str, measured: Any, detail: str = "", expected: str = "reported, not judged") -> "Check":
        """A figure worth showing that no threshold judges: neither a pass nor a failure."""
        return cls(name, CheckStatus.INFO, measured, expected, detail, "")

    @classmethod
    def crashed(cls, name: str, exc: BaseException) -> "Check":
        """A check that raised: the traceback as its detail; an error that carries its own fix
        (`AgentrlError.hint`) gives it as the hint."""
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        hint = getattr(exc, "hint", "") or ("the check raised an exception; the traceback is in this report's JSON (detail) - "
                                            "rerun with AGENTRL_DEBUG=1 to see it on the console")
        return cls(name, CheckStatus.FAIL, None, "the check runs to completion", f"{type(exc).__name__}: {exc}\n\n{tb}", hint)


def guarded(name: str, fn: Callable[[], Check]) -> Check:
    """Run one check; an exception becomes a failing check with the traceback, not a crash."""
    try:
        result = fn()
    except Exception as exc:  # noqa: BLE001 - containment is the point
        return Check.crashed(name, exc)
    if not isinstance(result, Check):
        return Check(name, CheckStatus.FAIL, repr(result), "a Check", "check function returned no Check", "fix the stage module")
    return result


def stage_status(checks: list[Check]) -> CheckStatus:
    """fail when any check fails (or there is none); skip when nothing was judged (only skips and
    figures reported); else pass. `info` checks never decide it."""
    if not checks or any(c.status == CheckStatus.FAIL for c in checks):
        return CheckStatus.FAIL
    if not any(c.status == CheckStatus.PASS for c in checks):
        return CheckStatus.SKIP
    return CheckStatus.PASS


def count_statuses(checks: list[Check]) -> dict[str, int]:
    """How many checks have each status, every status present (the `counts` of a report's JSON)."""
    return {s.value: sum(c.status == s for c in checks) for s in CheckStatus}


def overall(checks: list[Check]) -> CheckStatus:
    """fail when any check fails, else pass: the status of a command that runs checks outside the
    runbook (bench, image), where nothing judged is not a failure."""
    return CheckStatus.FAIL if any(c.status == CheckStatus.FAIL for c in checks) else CheckStatus.PASS


def apply_strict(checks: list[Check]) -> list[Check]:
    out = []
    for c in checks:
        if c.status == CheckStatus.SKIP:
            c = Check(c.name, CheckStatus.FAIL, c.measured, c.expected, f"skipped under --strict: {c.detail}",
                      c.hint or "run without --strict, or provide what the check needs")
        out.append(c)
    return out


@dataclass
class StageReport:
    stage: int
    title: str
    status: CheckStatus
    checks: list[Check]
    started_at: str
    duration_s: float
    run_id: str
    config_hash: str
    environment: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return count_statuses(self.checks)

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

    def __post_init__(self) -> None:
        self.status = CheckStatus(self.status)

    def to_markdown(self) -> str:
        out = [f"# Stage {self.stage}: {self.title} — {self.status.upper()}", "",
               f"run `{self.run_id}` · config `{self.config_hash}` · started {self.started_at} · "
               f"{self.duration_s:.2f} s · {counts_line(self.checks)}", ""]
        out += checks_markdown(self.checks)
        if self.notes:
            out += ["", "## Notes", ""] + [f"- {n}" for n in self.notes]
        return "\n".join(out) + "\n"


def counts_line(checks: list[Check]) -> str:
    """'1 pass, 0 fail, 2 skip, 0 info'."""
    return ", ".join(f"{n} {status}" for status, n in count_statuses(checks).items())


def checks_markdown(checks: list[Check], level: int = 2) -> list[str]:
    """The Markdown of a list of checks, as every report writes it: the table, then each failure and
    skip with what to do, the figures reported but not judged, and the long details; `level` is the
    heading level of those sections."""
    h = "#" * level
    out = ["| check | status | measured | expected |", "|---|---|---|---|"]
    for ch in checks:
        out.append(f"| {_md(ch.name)} | {ch.status} | {_md(format_measured(ch.measured))} | {_md(ch.expected)} |")
    problems = [ch for ch in checks if ch.status in (CheckStatus.FAIL, CheckStatus.SKIP)]
    if problems:
        out += ["", f"{h} Failures and skips", ""]
        for ch in problems:
            out.append(f"- **{ch.name}** ({ch.status}): {first_line(ch.detail)}")
            if ch.hint:
                out.append(f"  - what to do: {ch.hint}")
    reported = [ch for ch in checks if ch.status == CheckStatus.INFO and ch.detail]
    if reported:
        out += ["", f"{h} Reported, not judged", ""] + [f"- **{ch.name}**: {first_line(ch.detail)}" for ch in reported]
    long = [ch for ch in checks if ch.detail.count("\n") > 1]
    if long:
        out += ["", f"{h} Details", ""]
        for ch in long:
            out += [f"{h}# {ch.name}", "", "```", ch.detail.rstrip(), "```", ""]
    return out


def first_line(text: str) -> str:
    return text.splitlines()[0] if text else ""


def checks_to_json(checks: list[Check]) -> list[dict]:
    """The checks as the JSON of every report and `--json` output carries them."""
    return [asdict(c) for c in checks]


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
    """Write the report's JSON and Markdown, secrets redacted (`core/redaction.py`): a check's
    detail may quote a log or a harness's output."""
    from agentrl_cli.core.redaction import current

    redactor = current()
    name = name or f"stage-{report.stage}"
    json_path, md_path = reports_dir / f"{name}.json", reports_dir / f"{name}.md"
    atomic_write_text(json_path, json.dumps(redactor.strings(report.to_dict()), indent=2, default=str) + "\n")
    atomic_write_text(md_path, redactor.text(report.to_markdown()))
    return json_path, md_path


def read_report(path: Path) -> StageReport:
    return StageReport.from_dict(json.loads(path.read_text(encoding="utf-8")))
