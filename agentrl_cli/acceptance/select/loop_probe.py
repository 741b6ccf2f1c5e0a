"""Two real measurements behind criteria 1, 2 and 5:

- `short_run`: a short asynchronous training loop with one backend (`training.backend`), the
  configured harnesses, the embedded inference server and a verified weight sync after every step
  (`loop_config`); its metrics give the sampling, training and sync seconds per step (the figures of
  stage 0, `baseline.loop_figures`), the policy lag of the trained samples (`train/policy_lag`,
  `rollout/staleness_mean`) and the sync share of the step.
- `abort_resume`: one greedy generation on an embedded server, aborted mid-decode through
  `/abort_request` (SGLang's), continued by `generate_resumable` from its partial tokens, and
  compared token for token with the same generation uninterrupted.

Not here: judging the figures (`probes.py`).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

from agentrl_cli.runtime.observe import keys
from agentrl_cli.weightsync.base import Published

STEPS = 3
ABORT_TOKENS = 160  # long enough to be aborted mid-decode on a CPU
ABORT_AFTER_BUSY_S = 0.1  # abort once the server has decoded this long
ABORT_DEADLINE_S = 120.0


def loop_config(cfg, backend: str, model: Path):
    """The probe loop: async with one version of lag, a sync after every step, small groups, one rank."""
    from agentrl_cli.config.load import with_overrides

    return with_overrides(cfg, {
        "training.backend": backend, "model.path": str(model), "rollout.mode": "async", "rollout.max_staleness": 1,
        "rollout.weight_sync_interval_steps": 1, "rollout.group_size": 2, "rollout.concurrency": min(cfg.rollout.concurrency, 8),
        "rollout.max_steps_per_trajectory": min(cfg.rollout.max_steps_per_trajectory, 2),
        "inference.max_new_tokens": min(cfg.inference.max_new_tokens, 16), "training.micro_batch_size": 4,
        "training.gradient_accumulation_steps": 1, "training.checkpoint_interval_steps": 10_000,
        "training.resume_from_latest": False, "training.world_size": 1, "training.lora": None,
    }, f"agentrl select: the short loop of {backend}")


def short_run(cfg, backend: str, model: Path, workdir: Path, run_id: str, steps: int = STEPS,
              progress=lambda message: None) -> dict:
    """Train `steps` steps with `backend`; the loop's figures (see module doc)."""
    from agentrl_cli.acceptance.baseline import loop_figures
    from agentrl_cli.core.outcomes import Phase
    from agentrl_cli.run.training_run import training

    cfg = loop_config(cfg, backend, model)

    async def go():
        async with training(cfg, workdir, model, run_id=run_id, phase=Phase.BASELINE, progress=progress) as run:
            return await run.run(steps)
    started = time.monotonic()
    summary = asyncio.run(go())
    figures = loop_figures(summary) if summary.metrics else {"steps": summary.steps}
    rows = summary.metrics
    lags = [r.get(keys.TRAIN_POLICY_LAG) for r in rows]
    step_s = sum(r.get(keys.time_part("step_s")) or 0.0 for r in rows)
    sync_s = sum(r.get(keys.TIME_SYNC_S) or 0.0 for r in rows)
    figures.update({
        "backend": backend, "wall_s_total": round(time.monotonic() - started, 2), "mode": cfg.rollout.mode,
        "max_staleness": cfg.rollout.max_staleness, "policy_lag_per_step": lags,
        "staleness_mean_per_step": [r.get(keys.ROLLOUT_STALENESS_MEAN) for r in rows],
        "dropped_stale": summary.counters.get("buffer/dropped_stale", 0),
        "verified_syncs": sum(1 for s in summary.syncs if Published.verified(s)),
        "step_s": round(step_s, 3), "sync_s": round(sync_s, 3),
        "sync_share_of_step": round(sync_s / step_s, 4) if step_s else None,
        "phases_every_step": all(r.get(k) is not None for r in rows for k in keys.PHASE_TIMES.values()) and bool(rows),
    })
    return figures


def abort_resume(model: Path) -> dict:
    """Abort a generation mid-decode on a real embedded server and resume it from its partial tokens."""
    from agentrl_cli.engines.inference.client import InferenceClient, SamplingParams
    from agentrl_cli.engines.inference.engine import HFEngine
    from agentrl_cli.engines.inference.hf_server import create_app
    from agentrl_cli.engines.resume import ResumePolicy, generate_resumable
    from agentrl_cli.core.serving import ServerThread

    engine = HFEngine(model, batch_window_ms=5, weight_version="0")
    server = ServerThread(create_app(engine), name="select-abort").start()
    prompt = [72, 101, 108, 108, 111, 32]
    sampling = SamplingParams(max_new_tokens=ABORT_TOKENS, temperature=0.0, ignore_eos=True)

    async def go():
        import httpx

        client = InferenceClient(server.url, max_retries=3, backoff_s=0.05)
        try:
            reference = await client.generate(prompt, sampling)
            counters: Counter = Counter()
            async with httpx.AsyncClient() as http:
                async def busy() -> float:
                    info = (await http.get(server.url + "/get_server_info")).json()
                    return info["internal_states"][0]["busy_seconds_total"]
                before = await busy()
                task = asyncio.create_task(generate_resumable(client, prompt, sampling, ResumePolicy(), counters))
                end = time.monotonic() + ABORT_DEADLINE_S
                while await busy() - before < ABORT_AFTER_BUSY_S:
                    if task.done() or time.monotonic() > end:
                        break
                    await asyncio.sleep(0.02)
                aborted_before_end = not task.done()
                if aborted_before_end:
                    await http.post(server.url + "/abort_request", json={"abort_all": True})
                gen = await asyncio.wait_for(task, ABORT_DEADLINE_S)
            return reference, gen, counters, aborted_before_end
        finally:
            await client.close()
    try:
        reference, gen, counters, aborted = asyncio.run(go())
    finally:
        server.stop()
        engine.close()
    pieces = gen.meta.get("pieces", [])
    return {"requested_tokens": ABORT_TOKENS, "abort_sent_mid_decode": aborted,
            "pieces_tokens": [p.get("tokens") for p in pieces], "generated_tokens": len(gen.output_ids),
            "aborted_generations": counters.get("aborted_generations", 0),
            "resumed_generations": counters.get("resumed_generations", 0), "wasted_tokens": counters.get("wasted_tokens", 0),
            "token_exact_vs_uninterrupted": list(gen.output_ids) == list(reference.output_ids)}
