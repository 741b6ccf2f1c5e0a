"""Greedy evaluation during a run: every harness's eval tasks at once (one server batch across all
of them, at most `rollout.eval_concurrency` episodes in flight), success per harness appended to the
run's metrics as `eval/<harness>/success_rate` and `eval/<harness>/episodes`."""

from __future__ import annotations

import asyncio

from agentrl_cli.runtime.observe import keys


async def evaluate(run, eval_tasks: dict) -> dict:
    """The row of one evaluation of `eval_tasks` (harness -> tasks) at the run's current step."""
    names = list(eval_tasks)
    n = run.cfg.rollout.eval_concurrency
    limit = asyncio.Semaphore(n) if n > 0 else None
    results = await asyncio.gather(*(run.controller.evaluate(eval_tasks[h], temperature=0.0, limit=limit) for h in names))
    run.metrics.append({keys.STEP: run.step, keys.VERSION: run.version,  # the curve, readable while the run goes on
                        **{keys.eval_success_rate(h): r["success_rate"] for h, r in zip(names, results)},
                        **{keys.eval_episodes(h): r["n"] for h, r in zip(names, results)}})
    return {"step": run.step, "version": run.version, **dict(zip(names, results))}
