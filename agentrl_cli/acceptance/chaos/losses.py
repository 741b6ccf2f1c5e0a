"""The loss ledger of a chaos run: what happened to every trajectory and every trained draw.

- generated: episodes the run's attempts played (a trajectory reused from the store after a resume
  is not played again);
- stored: distinct trajectories of the run in the store, and rows stored twice;
- trained: trajectories of the draws the final ledger says were trained on (`run/loop/ledger.py`), of
  which masked (infra_error: in a trained group, no learning signal);
- missing: trained trajectories not in the store, and draws the uninterrupted reference trained
  and this run did not; duplicated: rows stored twice, draws trained twice;
- dropped as stale and episodes that raised, which would make the draws differ from the
  reference's for reasons other than the faults (`held` requires none).

Belongs here: counting from the store, the ledgers and the attempts' counters. Not here: the
faults (`injector.py`), comparing ledgers (`run/loop/ledger.py`).
"""

from __future__ import annotations

from collections import Counter

from agentrl_cli.run.loop.ledger import compare
from agentrl_cli.core.outcomes import RewardStatus


def loss_ledger(store, *, run_id: str, phase: str, ledger: list[dict], reference: list[dict], attempts: list) -> dict:
    import pyarrow.compute as pc

    table = store.read_table((pc.field("run_id") == run_id) & (pc.field("phase") == phase))
    ids = table.column("trajectory_id").to_pylist()
    statuses = dict(zip(ids, table.column("reward_status").to_pylist()))
    rows = Counter(ids)
    trained_ids = [f"{run_id}-{phase}-{d['group_id']}-{i}" for entry in ledger for d in entry["draws"]
                   for i in range(d["episodes"])]
    counters: Counter = Counter()
    for run in attempts:
        if run.controller is not None:
            counters.update(run.controller.counters)
            counters.update({f"buffer/{k}": v for k, v in run.buffer.counters.items() if k == "dropped_stale"})
    draws = compare(ledger, reference)
    missing_stored = sorted(t for t in set(trained_ids) if t not in rows)
    spooled = store.spooled() if hasattr(store, "spooled") else 0
    out = {
        "generated": sum(v for k, v in counters.items() if k.startswith("termination_")),
        "reused_after_resume": counters.get("reused_after_resume", 0),
        "stored": len(rows),
        "stored_twice": sorted(t for t, n in rows.items() if n > 1),
        "spooled_not_uploaded": spooled,
        "trained": len(trained_ids),
        "trained_masked": sum(statuses.get(t) == RewardStatus.INFRA_ERROR for t in trained_ids),
        "trained_not_stored": missing_stored,
        "draws": {"trained": draws["trained"], "reference": draws["reference"], "missing": [list(d) for d in draws["missing"]],
                  "repeated": [list(d) for d in draws["repeated"]], "extra": [list(d) for d in draws["extra"]]},
        "dropped_stale": counters.get("buffer/dropped_stale", 0),
        "episode_errors": counters.get("episode_errors", 0),
    }
    out["missing"] = len(missing_stored) + len(draws["missing"])
    out["duplicated"] = len(out["stored_twice"]) + len(draws["repeated"])
    out["draws_equal"] = not (draws["missing"] or draws["repeated"] or draws["extra"])
    problems = []
    if out["missing"]:
        problems.append(f"{out['missing']} missing")
    if out["duplicated"]:
        problems.append(f"{out['duplicated']} duplicated")
    if not out["draws_equal"]:
        problems.append("the trained draws differ from the uninterrupted run's")
    if spooled:
        problems.append(f"{spooled} file(s) still in the spool, never uploaded")
    if out["dropped_stale"] or out["episode_errors"]:
        problems.append(f"{out['dropped_stale']} episodes dropped as stale and {out['episode_errors']} that raised: "
                        "the draws cannot be compared")
    out["held"] = not problems
    out["detail"] = "; ".join(problems)
    return out
