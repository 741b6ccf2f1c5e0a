"""pass@k and the totals of an evaluation, per harness and task family.

pass@k is the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models Trained on
Code"): with `n` samples of a task of which `c` succeeded, the chance that at least one of `k` drawn
without replacement succeeds, 1 - C(n-c, k) / C(n, k), computed as 1 - prod(1 - k/i, i = n-c+1..n)
so that no binomial coefficient is formed. A group's pass@k is its mean over the tasks with at least
`k` scored samples; an episode lost to the infrastructure is no sample.

Over what: the sampled episodes (`samples` per task at the evaluation's temperature). An evaluation
that draws no samples (`samples` = 0) reports pass@1 over its greedy episodes (n = 1 per task).

Belongs here: the estimator and the totals read from the results of the planned episodes (each the
latest attempt's row of `results.jsonl`, `evaldir.latest`). Not here: playing episodes (`runner.py`),
the plan (`plan.py`).
"""

from __future__ import annotations

from collections import defaultdict

GREEDY, SAMPLE = "greedy", "sample"
OK, ERROR = "ok", "error"


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one task with `n` samples, `c` of them successes (needs n >= k >= 1)."""
    if not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n (at least k samples), got n={n}, k={k}")
    if n - c < k:  # every draw of k holds a success
        return 1.0
    failing_draws = 1.0
    for i in range(n - c + 1, n + 1):
        failing_draws *= 1.0 - k / i
    return 1.0 - failing_draws


def summarize(manifest: dict, latest: dict[str, dict]) -> dict:
    """The totals of an evaluation: over all its tasks, per harness, and per family within each
    harness. `latest`: episode key -> the row of its latest attempt (absent = not played yet)."""
    ks, samples = [int(k) for k in manifest["ks"]], int(manifest["samples"])
    held_out = {h["name"]: bool(h.get("held_out")) for h in manifest["harnesses"]}
    tasks = {t["no"]: t for t in manifest["tasks"]}
    by_task: dict[int, list[tuple[dict, dict | None]]] = defaultdict(list)
    for ep in manifest["episodes"]:
        by_task[ep["task"]].append((ep, latest.get(ep["key"])))
    harnesses: dict[str, dict] = {}
    for name in [h["name"] for h in manifest["harnesses"]]:
        mine = [no for no, t in tasks.items() if t["harness"] == name]
        families = sorted({tasks[no]["family"] for no in mine})
        harnesses[name] = {"held_out": held_out[name], **_group(mine, by_task, ks, samples),
                           "families": {f: _group([no for no in mine if tasks[no]["family"] == f], by_task, ks, samples)
                                        for f in families}}
    overall = _group(list(tasks), by_task, ks, samples)
    return {"complete": overall["errors"] == 0 and overall["missing"] == 0, "all": overall, "harnesses": harnesses}


def _group(task_nos: list[int], by_task: dict, ks: list[int], samples: int) -> dict:
    """Totals of one group of tasks: greedy success, pass@k for each k, episodes scored, lost, not played."""
    scored = errors = missing = greedy_n = greedy_success = 0
    per_task: list[tuple[int, int]] = []  # (n, c) of each task's pass@k episodes
    for no in task_nos:
        n = c = 0
        for ep, row in by_task.get(no, []):
            if row is None:
                missing += 1
                continue
            if row["status"] != OK:
                errors += 1
                continue
            scored += 1
            won = bool(row["success"])
            if ep["mode"] == GREEDY:
                greedy_n, greedy_success = greedy_n + 1, greedy_success + won
            if (ep["mode"] == SAMPLE) == (samples > 0):
                n, c = n + 1, c + won
        per_task.append((n, c))
    out = {"tasks": len(task_nos), "episodes": scored, "errors": errors, "missing": missing,
           "greedy": {"n": greedy_n, "success": greedy_success, "rate": greedy_success / greedy_n if greedy_n else None}}
    out["pass_at_k"] = {}
    for k in ks:
        counted = [pass_at_k(n, c, k) for n, c in per_task if n >= k]
        out["pass_at_k"][str(k)] = {"value": sum(counted) / len(counted) if counted else None, "tasks": len(counted)}
    return out
