"""Greedy evaluation during a run: every harness's eval tasks at once (one server batch across all
of them, at most `rollout.eval_concurrency` episodes in flight), success per harness appended to the
run's metrics as `eval/<harness>/success_rate` and `eval/<harness>/episodes`."""

from __future__ import annotations

import asyncio

from agentrl_cli.runtime.observe import keys


async def evaluate(parts, state, eval_tasks: dict, *, concurrency: int) -> dict:
    """The row of one evaluation of `eval_tasks` (harness -> tasks) at the run's current step
    (`parts`, `state`: `run/parts.py`; `concurrency`: rollout.eval_concurrency)."""
    names = list(eval_tasks)
    limit = asyncio.Semaphore(concurrency) if concurrency > 0 else None
    results = await asyncio.gather(*(parts.controller.evaluate(eval_tasks[h], temperature=0.0, limit=limit) for h in names))
    parts.metrics.append({keys.STEP: state.step, keys.VERSION: state.version,  # the curve, readable while the run goes on
                          **{keys.eval_success_rate(h): r["success_rate"] for h, r in zip(names, results)},
                          **{keys.eval_episodes(h): r["n"] for h, r in zip(names, results)}})
    return {"step": state.step, "version": state.version, **dict(zip(names, results))}
