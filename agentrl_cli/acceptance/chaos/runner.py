"""`agentrl chaos` end to end: start the services, train the uninterrupted reference (unless its
ledger is given), train again with the faults injected, and report.

The run is stage 8's loop made small (`chaos_sets`): two trainer ranks, two inference servers, the
reward and sandbox services as processes, an S3 store, async rollout. Its staleness bound is as
long as the run, so no draw is dropped as stale: which draws an async run trains then depends on
the seed alone, and the faulted run must train exactly the reference's.

Cost: the reference is a second run of the same length (reported in `cost`); `--reference` takes
the ledger an earlier reference run left instead (`<dir>/reference-ledger.json`).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path
from typing import Callable

from agentrl_cli.acceptance.chaos.injector import Injector
from agentrl_cli.acceptance.chaos.losses import loss_ledger
from agentrl_cli.acceptance.chaos.schedule import DESCRIPTIONS, OUTAGE_S, plan
from agentrl_cli.acceptance.chaos.services import ChaosServices, moto_available
from agentrl_cli.run.loop.ledger import FILE as LEDGER_FILE
from agentrl_cli.run.loop.ledger import read_ledger
from agentrl_cli.core.outcomes import Phase

SCHEMA_VERSION = 1
REPORT = "chaos.json"
REFERENCE_LEDGER = "reference-ledger.json"


def read_reference(path: Path) -> list[dict]:
    """A ledger of trained draws: a checkpoint's ledger.json or the reference-ledger.json a chaos run left."""
    from agentrl_cli.core.errors import UsageError

    try:
        return list(json.loads(Path(path).read_text(encoding="utf-8"))["steps"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"--reference {path}: not a ledger of trained draws ({type(exc).__name__}: {exc})",
                         f"give the {REFERENCE_LEDGER} an earlier `agentrl chaos` left, or a checkpoint's {LEDGER_FILE}") from None


def check_usage(cfg, kinds: list[str]) -> None:
    """Refuse a config under which a requested fault could not be injected or recovered (UsageError)."""
    from agentrl_cli.core.errors import UsageError

    if "rank" in kinds and cfg.training.world_size < 2:
        raise UsageError(f"the rank fault kills one of several trainer ranks; training.world_size is {cfg.training.world_size}",
                         "leave training.world_size at 2 (the chaos default), or leave rank out of --faults")
    if "server" in kinds and cfg.inference.urls:
        raise UsageError("the server fault kills a server the run started; inference.urls names servers it did not start",
                         "unset inference.urls, or leave server out of --faults")
    if {"server", "sandbox"} & set(kinds) and cfg.observe.health_interval_s <= 0:
        raise UsageError("observe.health_interval_s is 0: the run has no supervisor to restart a killed server or service",
                         "leave observe.health_interval_s at 1 (the chaos default), or leave server and sandbox out of --faults")


def chaos_sets(steps: int) -> list[str]:
    """The short stage-8 run as `--set` entries (a user's own --set after them wins)."""
    return [f"{k}={v}" for k, v in {
        "training.world_size": 2, "training.micro_batch_size": 2, "training.checkpoint_interval_steps": 2,
        "training.learning_rate": 1e-5, "training.max_restarts": 2, "training.start_timeout_s": 300,
        "training.rank_timeout_s": 120, "training.checkpoint_timeout_s": 120, "training.weight_sync_timeout_s": 60,
        "inference.replicas": 2, "inference.max_new_tokens": 16, "inference.startup_timeout_s": 120,
        "inference.request_timeout_s": 30, "rollout.mode": "async", "rollout.group_size": 2, "rollout.concurrency": 4,
        "rollout.max_steps_per_trajectory": 2, "rollout.weight_sync_interval_steps": 1, "rollout.max_staleness": steps,
        "rollout.buffer_size": 8, "rollout.env_create_retries": 5, "reward.max_retries": 7, "data.rows_per_file": 2,
        "observe.health_interval_s": 1.0, "supervisor.backoff_s": 0.5, "sandbox.pool_size": 2}.items()]


async def _train(cfg, run_dir: Path, model_path: Path, *, run_id: str, steps: int, components: list,
                 injector: Injector | None, progress: Callable[[str], None]) -> dict:
    """One run under `supervised` (restarted after trainer crashes); what it left."""
    from agentrl_cli.run.training_run import supervised

    attempts: list = []

    async def body(run):
        attempts.append(run)
        if injector is not None:
            injector.attach(run)
        try:
            summary = await run.run(steps, on_step=injector.on_step if injector is not None else lambda row: None)
            if injector is not None:
                progress("waiting for the last faults to recover")
                await injector.settle()
            return summary
        except Exception as exc:
            if injector is not None:
                injector.crashed(run, exc)
            raise

    watcher = asyncio.create_task(injector.watch()) if injector is not None else None
    t0 = time.monotonic()
    error = None
    summary = None
    try:
        summary = await supervised(cfg, run_dir, model_path, body, run_id=run_id, phase=Phase.TRAIN, progress=progress,
                                   components=components)
    except Exception as exc:  # noqa: BLE001 - the report says how the run ended
        error = f"{type(exc).__name__}: {getattr(exc, 'message', None) or exc}"
    finally:
        if watcher is not None:
            watcher.cancel()
        if injector is not None:
            injector.reopen_all()
    final = run_dir / "checkpoints" / f"step-{steps:08d}"
    return {"seconds": round(time.monotonic() - t0, 1), "error": error, "attempts": attempts,
            "steps": summary.steps if summary is not None else max((a.step for a in attempts), default=0),
            "restarts": summary.restarts if summary is not None else [],
            "ledger": read_ledger(final) if final.is_dir() else [], "ledger_path": final / LEDGER_FILE}


def run_chaos(cfg, out_dir: Path, model_path: Path, *, run_id: str, kinds: list[str], seed: int, steps: int,
              reference: Path | None = None, progress: Callable[[str], None] = lambda msg: None) -> dict:
    """Everything `agentrl chaos` does; the report (also written to `<out_dir>/chaos.json`)."""
    from agentrl_cli.config.load import with_overrides

    out_dir.mkdir(parents=True, exist_ok=True)
    services = ChaosServices(cfg, out_dir / "services", s3="store" in kinds or moto_available())
    try:
        services.start(progress)
        run_cfg = with_overrides(cfg, services.overrides(), "agentrl chaos")
        components = services.components()
        if reference is None:
            progress(f"training the uninterrupted reference ({steps} steps)")
            ref = asyncio.run(_train(run_cfg, out_dir / "reference", model_path, run_id=f"{run_id}-reference",
                                     steps=steps, components=components, injector=None, progress=progress))
            reference_ledger, reference_info = ref["ledger"], {"source": "trained in this command", "seconds": ref["seconds"],
                                                               "steps": ref["steps"], "error": ref["error"]}
        else:
            reference_ledger = read_reference(reference)
            reference_info = {"source": str(reference), "seconds": 0.0, "steps": len(reference_ledger), "error": None}
        (out_dir / REFERENCE_LEDGER).write_text(json.dumps({"schema_version": 1, "steps": reference_ledger}) + "\n",
                                                encoding="utf-8")
        faults = plan(kinds, seed, steps, servers=run_cfg.inference.replicas, ranks=run_cfg.training.world_size,
                      checkpoint_every=run_cfg.training.checkpoint_interval_steps)
        progress(f"training with faults injected ({', '.join(f.kind + '@' + str(f.after_step) for f in faults)})")
        injector = Injector(faults, run_cfg, services, steps)
        faulted = asyncio.run(_train(run_cfg, out_dir / "faulted", model_path, run_id=run_id, steps=steps,
                                     components=components, injector=injector, progress=progress))
        from agentrl_cli.runtime.data.stores import open_store

        losses = loss_ledger(open_store(run_cfg.data), run_id=run_id, phase=Phase.TRAIN, ledger=faulted["ledger"],
                             reference=reference_ledger, attempts=faulted["attempts"])
        where = services.describe()
    finally:
        services.stop()
    rows = injector.rows()
    problems = [f"{r['kind']}: {r['detail']}" for r in rows if r["status"] != "pass"]
    if faulted["error"]:
        problems.insert(0, f"the run failed: {faulted['error']}")
    elif faulted["steps"] < steps:
        problems.insert(0, f"the run stopped at step {faulted['steps']} of {steps}")
    if reference_info["error"]:
        problems.append(f"the reference run failed: {reference_info['error']}")
    elif reference_info["steps"] != steps:
        problems.append(f"the reference trained {reference_info['steps']} steps, this run {steps}: the draws cannot match")
    if not losses["held"]:
        problems.append(f"losses: {losses['detail']}")
    report = {
        "schema_version": SCHEMA_VERSION, "run_id": run_id, "seed": seed, "steps": steps, "faults_requested": kinds,
        "status": "fail" if problems else "pass", "problems": problems,
        "plan": [{"kind": f.kind, "after_step": f.after_step, "fault": DESCRIPTIONS[f.kind]} for f in faults],
        "faults": rows, "losses": losses,
        "run": {"steps": faulted["steps"], "restarts": faulted["restarts"], "seconds": faulted["seconds"],
                "error": faulted["error"], "dir": str(out_dir / "faulted")},
        "reference": reference_info, "services": where,
        "cost": {"faulted_s": faulted["seconds"], "reference_s": reference_info["seconds"], "outage_s": OUTAGE_S},
    }
    (out_dir / REPORT).write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    if faulted["ledger_path"].is_file():
        shutil.copyfile(faulted["ledger_path"], out_dir / "faulted-ledger.json")
    return report
