"""An evaluation's directory, `<observe.runs_dir>/<eval_id>/`, and the files resume reads.

- `eval.json`, the manifest: the model, the config it ran with (secrets masked), the split, the k's,
  the samples per task and their temperature, the tasks and every planned episode with its seed,
  and one entry per resume. Written whole (atomically) when the evaluation starts and at each resume.
- `results.jsonl`: one row per finished episode (played, scored, and its trajectory published to
  the store before the row is written), appended and fsync'd. A row is never rewritten: an episode
  played again after an infrastructure error gets a row of its later attempt, and the latest
  attempt's row counts (`latest`). A line torn by a kill is cut off before the next append (`repair`).
- `summary.json`: the totals of the last invocation (`passk.summarize`), rewritten each time.
- `logs/`, `metrics.jsonl`: the inference servers' logs and the rollout side's rows, as a run's.
- `.lock`: locked while an invocation plays the evaluation (`lock`).

An evaluation directory has no `meta.json`: it is not a training run (`agentrl runs list` does not
list it, and `latest` still names the newest training run). Not here: what the rows mean
(`passk.py`), what is planned (`plan.py`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from agentrl_cli.core.errors import NotFoundError, UsageError
from agentrl_cli.core.report import atomic_write_text
from agentrl_cli.core.rundir import new_run_id

SCHEMA_VERSION = 1
PREFIX = "eval-"
MANIFEST, RESULTS, SUMMARY, LOCK = "eval.json", "results.jsonl", "summary.json", ".lock"


def new_eval_id() -> str:
    return f"{PREFIX}{new_run_id()}"


@dataclass
class EvalDir:
    path: Path

    @property
    def eval_id(self) -> str:
        return self.path.name

    @property
    def manifest_path(self) -> Path:
        return self.path / MANIFEST

    @property
    def results_path(self) -> Path:
        return self.path / RESULTS

    @property
    def summary_path(self) -> Path:
        return self.path / SUMMARY

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Held while an invocation plays this evaluation: a second one is refused (exit 2). The
        kernel releases it when its holder dies, so a killed evaluation can be resumed at once."""
        with (self.path / LOCK).open("a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise UsageError(f"evaluation {self.eval_id} is being played by another agentrl eval",
                                 "wait for it to end (or stop it), then resume") from None
            yield

    def manifest(self) -> dict:
        try:
            data = json.loads(self.manifest_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise UsageError(f"cannot read the evaluation's manifest {self.manifest_path}: {exc}",
                             "resume another evaluation, or start a new one") from None
        if data.get("schema_version") != SCHEMA_VERSION:
            raise UsageError(f"{self.manifest_path} has schema_version {data.get('schema_version')!r}; this agentrl "
                             f"reads {SCHEMA_VERSION}", "resume it with the agentrl that started it, or start a new one")
        return data

    def write_manifest(self, manifest: dict) -> None:
        atomic_write_text(self.manifest_path, json.dumps(manifest, indent=1, default=str) + "\n")

    def write_summary(self, summary: dict) -> None:
        atomic_write_text(self.summary_path, json.dumps(summary, indent=2, default=str) + "\n")

    def results(self) -> list[dict]:
        """The rows of results.jsonl in order; a torn last line (a kill mid-append) is left out."""
        try:
            text = self.results_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        rows = []
        for line in text.splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
        return [r for r in rows if isinstance(r, dict) and "key" in r]

    def repair(self) -> None:
        """Cut a torn last line (no newline: its write was killed) so the next append starts clean."""
        try:
            data = self.results_path.read_bytes()
        except FileNotFoundError:
            return
        if data and not data.endswith(b"\n"):
            with self.results_path.open("r+b") as f:
                f.truncate(data.rfind(b"\n") + 1)
                f.flush()
                os.fsync(f.fileno())

    def append(self, rows: list[dict]) -> None:
        """Append rows, durable when this returns (one write, then fsync)."""
        if not rows:
            return
        text = "".join(json.dumps(r, default=str, ensure_ascii=False) + "\n" for r in rows)
        with self.results_path.open("a", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())


def latest(rows: list[dict]) -> dict[str, dict]:
    """Episode key -> the row of its latest attempt (of equal attempts, the later row)."""
    out: dict[str, dict] = {}
    for row in rows:
        held = out.get(row["key"])
        if held is None or int(row.get("attempt", 0)) >= int(held.get("attempt", 0)):
            out[row["key"]] = row
    return out


def create_eval_dir(runs_dir: Path) -> EvalDir:
    d = EvalDir(Path(runs_dir).expanduser() / new_eval_id())
    d.path.mkdir(parents=True)
    return d


def list_evals(runs_dir: Path) -> list[EvalDir]:
    """Evaluations under `runs_dir`, newest first (by the manifest's creation time, then name)."""
    root = Path(runs_dir).expanduser()
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        if (p / MANIFEST).is_file():
            try:
                created = json.loads((p / MANIFEST).read_text(encoding="utf-8")).get("created_at", "")
            except (OSError, ValueError):
                created = ""
            found.append((str(created), p.name, EvalDir(p)))
    return [d for _, _, d in sorted(found, key=lambda x: (x[0], x[1]), reverse=True)]


def find_eval(runs_dir: Path, ref: str) -> EvalDir:
    """The evaluation `ref` names: its id under `runs_dir`, `latest`, or its directory."""
    evals = list_evals(runs_dir)
    if ref == "latest":
        if not evals:
            raise NotFoundError(f"no evaluation under {runs_dir} to resume",
                                "start one with `agentrl eval MODEL_OR_RUN`, or set observe.runs_dir")
        return evals[0]
    for candidate in (Path(ref).expanduser(), Path(runs_dir).expanduser() / ref):
        if (candidate / MANIFEST).is_file():
            return EvalDir(candidate.absolute())
    known = ", ".join(d.eval_id for d in evals[:5]) or "none"
    raise NotFoundError(f"no evaluation {ref!r} under {runs_dir} (no {MANIFEST} there)",
                        f"give an evaluation id or `latest` (newest: {known})")
