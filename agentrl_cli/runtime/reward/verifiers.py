"""Outcome verifiers: each turns a scoring request into a score in [0, 1] plus flags.

`answer` (numeric or exact match of the final answer), `regex` (format check of the final answer or
the last action), `state` (files the agent had to produce), `tests` (hidden unit tests run in a
FRESH sandbox from the pool with hidden copies of the tests, tamper detection by hash, early-exit
detection) and `harness` (the score the harness's own `compute_reward` gave, sent with the request
as `harness_score`, so it is judged by the same rules anywhere: in [0, 1], flags kept, protected
files checked). A task picks its verifier with `meta.verify` (one of these, or a scorer or user
`module:function` from `registry.py`); `harnesses[].reward: harness` picks `harness` for every task
of that harness. A verifier that cannot do its job (sandbox down, crash) raises
`VerifierError`: that is an infrastructure failure, never the agent's zero. Aggregation, retries
and caching belong in `aggregate.py` and `scorer.py`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Protocol

from agentrl_cli.runtime.reward.models import ScoreRequest
from harnesses.hidden_tests import run_hidden_tests, tampered
from harnesses.parsing import answers_match


class VerifierError(RuntimeError):
    """The verifier could not judge (infrastructure); the scorer retries, then marks infra_error."""


@dataclass
class Verdict:
    score: float  # outcome in [0, 1]
    flags: list[str] = field(default_factory=list)
    detail: str = ""
    harness: float | None = None  # reward: mix: the harness's own score, the `harness` component


def mixed(verdict: Verdict, harness_part: Verdict) -> Verdict:
    """The task verifier's verdict with the harness's score beside it (`harnesses[].reward: mix`)."""
    return Verdict(verdict.score, sorted({*verdict.flags, *harness_part.flags}), f"{verdict.detail}; {harness_part.detail}",
                   harness=harness_part.score)


class Verifier(Protocol):
    name: str
    version: str

    def verify(self, req: ScoreRequest) -> Verdict: ...


class AnswerVerifier:
    name, version = "answer", "1"

    def verify(self, req: ScoreRequest) -> Verdict:
        if req.final_answer is None:
            return Verdict(0.0, detail="no final answer given")
        ok = answers_match(req.final_answer, req.task.answer)
        return Verdict(float(ok), detail=f"answer {req.final_answer!r:.60} {'matches' if ok else 'does not match'}")


class RegexVerifier:
    """`meta.pattern` must fully match the final answer (or, without one, the last action)."""

    name, version = "regex", "1"

    def verify(self, req: ScoreRequest) -> Verdict:
        pattern = req.task.meta.get("pattern")
        if not isinstance(pattern, str):
            raise VerifierError(f"task {req.task.task_id} has verify=regex but no meta.pattern")
        text = req.final_answer if req.final_answer is not None else (req.steps[-1].action if req.steps else "")
        ok = re.fullmatch(pattern, text.strip(), flags=re.DOTALL) is not None
        return Verdict(float(ok), detail=f"format {'matches' if ok else 'does not match'} {pattern!r}")


class StateVerifier:
    """Every file in `meta.state` must exist with exactly the expected content."""

    name, version = "state", "1"

    def verify(self, req: ScoreRequest) -> Verdict:
        files = req.file_map()
        expected = req.task.meta.get("state") or {}
        wrong = [p for p, text in sorted(expected.items())
                 if files.get(p) is None or files[p].decode("utf-8", "replace") != text]
        if not expected:
            raise VerifierError(f"task {req.task.task_id} has verify=state but no meta.state")
        return Verdict(0.0 if wrong else 1.0, detail=f"wrong or missing: {wrong}" if wrong else "state matches")


class HiddenTestsVerifier:
    """Runs `meta.tests` (never shown to the agent) against the submitted `solution.py` in a fresh
    sandbox; the pass needs each expected test id in the host-side report."""

    name, version = "tests", "2"
    SOLUTION = "solution.py"

    def __init__(self, provider, timeout_s: float = 10.0) -> None:
        self.provider, self.timeout_s = provider, timeout_s

    def verify(self, req: ScoreRequest) -> Verdict:
        tests = req.task.meta.get("tests") or []
        if not tests:
            raise VerifierError(f"task {req.task.task_id} has verify=tests but no hidden tests")
        files = req.file_map()
        bad = tampered(files, req.protected)
        if bad:
            return Verdict(0.0, ["tamper"], f"protected files edited or deleted: {bad}")
        source = files.get(self.SOLUTION)
        if source is None:
            return Verdict(0.0, detail=f"no {self.SOLUTION} submitted")
        if self.provider is None:
            raise VerifierError("no sandbox provider to run hidden tests in")
        try:
            result = run_hidden_tests(self.provider, source, tests, timeout_s=self.timeout_s)
        except Exception as exc:  # noqa: BLE001 - sandbox trouble is infrastructure, not the agent's zero
            raise VerifierError(f"hidden tests could not run: {type(exc).__name__}: {exc}") from exc
        if result["early_exit"]:
            return Verdict(0.0, ["tamper", "early_exit"], f"tests {result['early_exit']} exited 0 before reporting")
        expected = [t["id"] for t in tests]
        passed = [i for i in result["passed"] if i in expected]
        return Verdict(len(passed) / len(expected), detail=f"passed {len(passed)}/{len(expected)}: {passed}")


class HarnessScoreVerifier:
    """The harness's own score (`harness_score`); a request without one cannot be judged."""

    name, version = "harness", "1"

    def verify(self, req: ScoreRequest) -> Verdict:
        if req.harness_score is None:
            raise VerifierError(f"task {req.task.task_id}: reward_source is {req.reward_source} but the request "
                                "carries no harness_score (the harness's compute_reward was not run)")
        bad = tampered(req.file_map(), req.protected)
        if bad or "tamper" in req.harness_flags:
            return Verdict(0.0, sorted({"tamper", *req.harness_flags}),
                           f"protected files edited or deleted: {bad}" if bad else req.harness_detail or "harness flagged tampering")
        return Verdict(req.harness_score, list(req.harness_flags), req.harness_detail or f"harness score {req.harness_score:g}")


def default_verifiers(provider=None, timeout_s: float = 10.0) -> dict[str, Verifier]:
    return {"answer": AnswerVerifier(), "regex": RegexVerifier(), "state": StateVerifier(),
            "tests": HiddenTestsVerifier(provider, timeout_s), "harness": HarnessScoreVerifier()}
