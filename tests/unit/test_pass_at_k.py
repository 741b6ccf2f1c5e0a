"""pass@k (the unbiased estimator of Chen et al. 2021) against its closed form 1 - C(n-c, k)/C(n, k),
and the totals of an evaluation per harness and family over a hand-built plan and results."""

from __future__ import annotations

from math import comb

import pytest

from agentrl_cli.core.errors import UsageError
from agentrl_cli.acceptance.evaluation.evaldir import EvalDir, latest
from agentrl_cli.acceptance.evaluation.passk import pass_at_k, summarize
from agentrl_cli.acceptance.evaluation.plan import parse_ks, pending, sample_seed, spread_by_family


def closed_form(n: int, c: int, k: int) -> float:
    return 1 - comb(n - c, k) / comb(n, k)


@pytest.mark.parametrize(("n", "c", "k", "expected"), [
    (5, 2, 1, 0.4), (5, 2, 2, 0.7), (5, 0, 3, 0.0), (5, 4, 2, 1.0), (5, 5, 5, 1.0), (1, 1, 1, 1.0), (1, 0, 1, 0.0)])
def test_pass_at_k_on_hand_built_cases(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)
    assert pass_at_k(n, c, k) == pytest.approx(closed_form(n, c, k), abs=1e-12)


def test_pass_at_k_matches_the_closed_form_everywhere_up_to_n_20():
    for n in range(1, 21):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(closed_form(n, c, k), abs=1e-12), (n, c, k)


def test_pass_at_k_stays_finite_where_binomials_overflow_floats():
    assert pass_at_k(2000, 1, 1) == pytest.approx(1 / 2000)
    assert 0 < pass_at_k(2000, 3, 100) < 1


@pytest.mark.parametrize(("n", "c", "k"), [(3, 4, 1), (3, -1, 1), (3, 1, 0), (3, 1, 4)])
def test_pass_at_k_refuses_impossible_counts(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def manifest(samples: int = 3, ks=(1, 2)) -> dict:
    """Two harnesses: `a` with tasks 0, 1 (family x) and 2 (family y); `b` (held out) with task 3."""
    tasks = [{"no": 0, "harness": "a", "task_id": "a0", "family": "x"}, {"no": 1, "harness": "a", "task_id": "a1", "family": "x"},
             {"no": 2, "harness": "a", "task_id": "a2", "family": "y"}, {"no": 3, "harness": "b", "task_id": "b0", "family": "x"}]
    episodes = [{"key": f"t{t['no']:05d}-{i}", "task": t["no"], "mode": "greedy" if i == 0 else "sample", "index": i, "seed": i}
                for t in tasks for i in range(samples + 1)]
    return {"ks": list(ks), "samples": samples, "tasks": tasks, "episodes": episodes,
            "harnesses": [{"name": "a", "held_out": False}, {"name": "b", "held_out": True}]}


def row(key: str, success: bool, status: str = "ok", attempt: int = 0) -> dict:
    return {"key": key, "success": success, "status": status, "attempt": attempt}


def test_totals_per_harness_and_family_over_hand_built_results():
    rows = [
        row("t00000-0", True), row("t00000-1", True), row("t00000-2", False), row("t00000-3", False),  # a0: greedy ok, 1/3
        row("t00001-0", False), row("t00001-1", False), row("t00001-2", False), row("t00001-3", False),  # a1: 0/3
        row("t00002-0", False), row("t00002-1", True), row("t00002-2", True), row("t00002-3", True),  # a2: 3/3
        row("t00003-0", True), row("t00003-1", True), row("t00003-2", False, "error"),  # b0: 1/2 scored, one lost, one missing
    ]
    s = summarize(manifest(), latest(rows))
    a, b = s["harnesses"]["a"], s["harnesses"]["b"]
    assert (a["tasks"], a["episodes"], a["errors"], a["missing"]) == (3, 12, 0, 0)
    assert a["greedy"] == {"n": 3, "success": 1, "rate": pytest.approx(1 / 3)}
    assert a["pass_at_k"]["1"] == {"value": pytest.approx((1 / 3 + 0 + 1) / 3), "tasks": 3}
    assert a["pass_at_k"]["2"]["value"] == pytest.approx((closed_form(3, 1, 2) + 0 + 1) / 3)
    x, y = a["families"]["x"], a["families"]["y"]
    assert x["pass_at_k"]["2"]["value"] == pytest.approx(closed_form(3, 1, 2) / 2) and x["tasks"] == 2
    assert y["greedy"]["success"] == 0 and y["pass_at_k"]["1"]["value"] == 1.0
    assert b["held_out"] and (b["episodes"], b["errors"], b["missing"]) == (2, 1, 1)
    assert b["pass_at_k"]["1"] == {"value": 1.0, "tasks": 1}  # one scored sample: counted for k=1
    assert b["pass_at_k"]["2"] == {"value": None, "tasks": 0}  # fewer than k scored samples: not counted
    assert s["all"]["episodes"] == 14 and s["all"]["greedy"] == {"n": 4, "success": 2, "rate": 0.5}
    assert s["complete"] is False


def test_the_latest_attempt_counts_and_a_resume_plays_only_missing_and_lost_episodes():
    m = manifest(samples=1, ks=(1,))
    rows = [row("t00000-0", False), row("t00000-1", False, "error"), row("t00001-0", False, "error"),
            row("t00001-0", True, attempt=1), row("t00002-0", False), row("t00002-1", True), row("t00003-1", False)]
    done = latest(rows)
    assert done["t00001-0"]["success"] is True  # the replay after the infrastructure error
    assert [e["key"] for e in pending(m, done)] == ["t00000-1", "t00001-1", "t00003-0"]  # model failures are results
    complete = summarize(m, latest(rows + [row(k, False, attempt=1) for k in ("t00000-1", "t00001-1", "t00003-0")]))
    assert complete["complete"] and complete["all"]["episodes"] == 8


def test_without_samples_pass_at_1_is_over_the_greedy_episodes():
    m = manifest(samples=0, ks=(1,))
    s = summarize(m, latest([row("t00000-0", True), row("t00001-0", False), row("t00002-0", True), row("t00003-0", True)]))
    assert s["harnesses"]["a"]["pass_at_k"]["1"] == {"value": pytest.approx(2 / 3), "tasks": 3}
    assert s["harnesses"]["a"]["greedy"]["rate"] == pytest.approx(2 / 3)


def test_k_lists_seeds_and_spread():
    assert parse_ks("4, 1,4") == [1, 4]
    for bad in ("", "0", "1,x", "-2"):
        with pytest.raises(UsageError):
            parse_ks(bad)
    assert sample_seed(1, "h", "t", 2) == sample_seed(1, "h", "t", 2) != sample_seed(1, "h", "t", 3)
    assert 0 <= sample_seed(7, "h", "t", 0) < 2 ** 31

    class T:
        def __init__(self, family: str, i: int) -> None:
            self.meta, self.i = {"family": family}, i
    tasks = [T("x", i) for i in range(10)] + [T("y", i) for i in range(3)]
    assert [(t.meta["family"], t.i) for t in spread_by_family(tasks, 2)] == [("x", 0), ("x", 5), ("y", 0), ("y", 1)]


def test_a_line_torn_by_a_kill_is_skipped_then_cut_before_the_next_append(tmp_path):
    d = EvalDir(tmp_path)
    d.append([row("t00000-0", True)])
    with d.results_path.open("a") as f:
        f.write('{"key": "t00000-1", "succ')
    assert [r["key"] for r in d.results()] == ["t00000-0"]
    d.repair()
    d.append([row("t00000-1", False)])
    assert [r["key"] for r in d.results()] == ["t00000-0", "t00000-1"]


def test_an_evaluation_played_by_one_invocation_is_refused_to_another(tmp_path):
    d = EvalDir(tmp_path)
    with d.lock():
        with pytest.raises(UsageError, match="being played by another"):
            with d.lock():
                pass
    with d.lock():  # released with its holder
        pass
