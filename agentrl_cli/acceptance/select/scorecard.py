"""The framework-selection scorecard: seed 003 §四's eight criteria, the result of each criterion's
probe for each backend (one `Check` per cell), the exit code, and the JSON and Markdown views.

A cell is a `Check`: `measured` is the value, `detail` how it was measured, `expected` the threshold
it is judged against, `hint` what to do (the deployment action the seed ties to the criterion, made
concrete). A figure that no threshold can judge on this machine is `info`; a probe that could not
run is `skip` with its reason; a probe that raised is a `fail` with no measured value.

Exit code (`Scorecard.exit_code`): 0 when every requested criterion has a measured value for every
requested backend, whatever the verdicts (the scorecard compares backends: a failing criterion is a
finding about a backend, not an error of the command); 1 (`EXIT_CHECK_FAILED`) when a cell has no
measured value (skipped or crashed), listed in `unmeasured`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from agentrl_cli.core.errors import EXIT_CHECK_FAILED
from agentrl_cli.core.report import Check, CheckStatus, checks_markdown, format_measured

SCHEMA_VERSION = 1
REPORT_NAME = "select"  # reports/select.json, reports/select.md


@dataclass(frozen=True)
class Criterion:
    key: str
    title: str
    why: str  # why it matters for a deployment (seed 003 §四)
    action: str  # the deployment action the seed ties to it


CRITERIA: tuple[Criterion, ...] = (
    Criterion("throughput", "token throughput observable", "what cannot be measured cannot be optimised: idle time hides",
              "require the backend to expose sampling, training and sync times"),
    Criterion("decoupled", "training and inference decoupled, async sampling, partial-generation resume",
              "decides whether the long tail of slow episodes stalls the whole batch",
              "prefer asynchronous rollout with partial-generation resume (rollout.mode: async, rollout.allow_partial_resume)"),
    Criterion("parallel", "parallel strategy and memory flexibility", "decides whether it fits your interconnect and GPU type",
              "stress-test the parallel strategies on a small model, then read the configuration off the table"),
    Criterion("integration", "custom environment and reward integration", "decides the cost of adding each harness",
              "check for a stable interface (the harness contract), not only example scripts"),
    Criterion("weight_sync", "weight sync share of the step", "a slow sync leaves the inference side idle",
              "measure the sync share; when it is high, sync less often (rollout.weight_sync_interval_steps) or use a faster transport"),
    Criterion("checkpoint", "checkpoint resume and fault tolerance", "long jobs meet pre-emption and failures",
              "verify that checkpoints load across versions"),
    Criterion("dependencies", "dependency complexity and licences", "decides image size and compliance",
              "pin the dependency list (`agentrl image lock`) and check the licence terms"),
    Criterion("maintenance", "maintenance activity", "decides long-term maintainability",
              "watch defect response and interface stability upstream"),
)
BY_KEY = {c.key: c for c in CRITERIA}


def cell_name(criterion: str, backend: str) -> str:
    return f"{criterion} [{backend}]"


def measured(check: Check) -> bool:
    """A cell holds a measured value: judged or reported, with a value (not skipped, not crashed)."""
    return check.status != CheckStatus.SKIP and check.measured is not None


@dataclass
class Scorecard:
    backends: list[str]
    criteria: list[str]  # CRITERIA keys, in CRITERIA order
    cells: dict[tuple[str, str], Check]  # (criterion key, backend) -> its result
    run_id: str = ""
    started_at: str = ""
    duration_s: float = 0.0
    options: dict = field(default_factory=dict)
    tables: dict = field(default_factory=dict)  # e.g. "parallel": the stress table's rows
    notes: list[str] = field(default_factory=list)

    def cell(self, criterion: str, backend: str) -> Check:
        return self.cells.get((criterion, backend)) or Check.skipped(
            cell_name(criterion, backend), "no probe result was recorded for this cell")

    def unmeasured(self) -> list[dict]:
        out = []
        for c in self.criteria:
            for b in self.backends:
                ch = self.cell(c, b)
                if not measured(ch):
                    out.append({"criterion": c, "backend": b, "status": str(ch.status), "why": ch.detail.split("\n")[0]})
        return out

    @property
    def complete(self) -> bool:
        return not self.unmeasured()

    @property
    def exit_code(self) -> int:
        return 0 if self.complete else EXIT_CHECK_FAILED

    def to_dict(self) -> dict:
        return {
            "schema_version": SCHEMA_VERSION, "report": REPORT_NAME, "run_id": self.run_id, "started_at": self.started_at,
            "duration_s": round(self.duration_s, 2), "backends": self.backends, "complete": self.complete,
            "exit_code": self.exit_code, "unmeasured": self.unmeasured(), "options": self.options,
            "criteria": [{"key": c, "title": BY_KEY[c].title, "why": BY_KEY[c].why, "action": BY_KEY[c].action,
                          "results": {b: asdict(self.cell(c, b)) for b in self.backends}} for c in self.criteria],
            "tables": self.tables, "notes": self.notes,
        }

    def to_markdown(self) -> str:
        state = "complete" if self.complete else f"INCOMPLETE ({len(self.unmeasured())} cells without a measured value)"
        out = [f"# Framework selection scorecard — {state}", "",
               f"run `{self.run_id}` · started {self.started_at} · {self.duration_s:.1f} s · backends: "
               f"{', '.join(self.backends)}", "",
               "| criterion | " + " | ".join(self.backends) + " | deployment action |",
               "|---|" + "---|" * len(self.backends) + "---|"]
        for c in self.criteria:
            cells = [f"{self.cell(c, b).status}: {_md(format_measured(self.cell(c, b).measured))}" for b in self.backends]
            out.append(f"| {BY_KEY[c].title} | " + " | ".join(cells) + f" | {_md(BY_KEY[c].action)} |")
        rows = self.tables.get("parallel") or []
        if rows:
            out += ["", "## Parallel strategies: memory and step time", "", stress_markdown(rows, self.options)]
        for c in self.criteria:
            crit = BY_KEY[c]
            out += ["", f"## {crit.title}", "", f"Why: {crit.why}. Action: {crit.action}.", ""]
            checks = [self.cell(c, b) for b in self.backends]
            out += checks_markdown(checks, level=3)
            out += ["", "How each was measured:", ""]
            out += [f"- **{b}**: {_md(self.cell(c, b).detail.split(chr(10))[0]) or '—'}" for b in self.backends]
        if self.notes:
            out += ["", "## Notes", ""] + [f"- {n}" for n in self.notes]
        return "\n".join(out) + "\n"


def stress_markdown(rows: list[dict], options: dict) -> str:
    budget = options.get("memory_budget_gb")
    head = ("| strategy | ranks | status | peak MiB per rank (mbs: MiB) | step s (mbs: s) | fit MiB = a + b·mbs | "
            f"largest micro-batch within {budget} GB |")
    out = [head, "|---|---|---|---|---|---|---|"]
    for r in rows:
        peaks = ", ".join(f"{p['mbs']}: {p['peak_mib']:.0f}" for p in r.get("points", []))
        steps = ", ".join(f"{p['mbs']}: {p['step_s']:.3f}" for p in r.get("points", []))
        fit = r.get("fit") or {}
        fit_text = f"{fit['a_mib']:.0f} + {fit['b_mib']:.1f}·mbs" if fit else "—"
        largest = r.get("max_micro_batch")
        out.append(f"| {r['strategy']} | {r['ranks']} | {r['status']} | {peaks or '—'} | {steps or '—'} | {fit_text} | "
                   f"{'—' if largest is None else largest} |")
    return "\n".join(out)


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")
