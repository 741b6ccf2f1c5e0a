"""Checkpoints of a training run: when one is due, writing it (in the background while the next
step's samples come in, when the run overlaps), and resuming from the newest.

A checkpoint holds the trainer's engine and the run's own state: step, weight version, sampler
position, RNGs, the buffer's untrained episodes, the draws in flight, and the ledger of the draws
trained on so far (`ledger.json`, `ledger.py`). Resume restores all of it: buffered episodes are
read back from the store, in-flight draws run again first, a draw repeated after the resume reuses
its stored trajectory instead of storing it twice, and the ledger continues. So a run resumed any
number of times trains on exactly the draws an uninterrupted one does, each once.

The state is taken in `save`, in the same event-loop turn as the train step it follows (no await
between): every draw is then trained (in the ledger), buffered, or in flight, and none can be taken
off the buffer for the next step before the state is. A draw counts as in flight from the moment the
rollout starts it (`RolloutController.run`), so none is between the two. Only the writing runs in the
background, within `training.checkpoint_timeout_s` (then `CheckpointTimeout`: the run stops instead
of waiting on storage that does not answer; a checkpoint is only ever read once complete).
"""

from __future__ import annotations

import asyncio
import threading

from agentrl_cli.core.errors import AgentrlError
from agentrl_cli.run.loop.ledger import read_ledger, write_ledger
from agentrl_cli.learner.checkpoint import rng_state, set_rng_state


class CheckpointTimeout(AgentrlError):
    """Writing a checkpoint did not finish within `training.checkpoint_timeout_s`."""

    exit_code = 1


class CheckpointSchedule:
    """When the run's checkpoints are due and writing them, over the run's parts and state (`run/parts.py`)
    with its `training` config section (checkpoint_interval_steps, checkpoint_timeout_s)."""

    def __init__(self, parts, state, training, *, overlap: bool) -> None:
        self.parts, self.state, self.overlap = parts, state, overlap
        self.interval, self.timeout_s = training.checkpoint_interval_steps, training.checkpoint_timeout_s
        self._task: asyncio.Task | None = None

    def due(self, step: int, steps: int) -> bool:
        return step % self.interval == 0 or step == steps

    async def save(self, step: int, steps: int) -> str | None:
        """Write the checkpoint of `step`; in the background when overlapping and not the last step
        (its name then comes from `wait`)."""
        state = self._state()
        if self.overlap and step < steps:
            self._task = asyncio.create_task(self._write(state))
            return None
        return await self._write(state)

    async def wait(self) -> str | None:
        """The name of the checkpoint being written in the background, once written."""
        task, self._task = self._task, None
        return await task if task is not None else None

    def _state(self) -> dict:
        # no await here: every finished episode is published and either in the buffer snapshot or
        # still in flight; resume reloads the one and re-runs the other
        parts, state = self.parts, self.state
        parts.writer.flush()
        return {"step": state.step, "version": state.version, "sampler": parts.sampler.state_dict(), "rng": rng_state(),
                "buffer": parts.buffer.state_dict(), "inflight": parts.controller.snapshot(),
                "ledger": [dict(e) for e in state.ledger]}

    async def _write(self, state: dict) -> str:
        # the engine's weights stay as they are until the save returns (the next train step awaits it)
        parts, ckpt = self.parts, self.parts.checkpoints
        ledger = state.pop("ledger")

        def write(d):
            parts.backend.save_checkpoint(d / "engine", state)
            write_ledger(d, ledger)
        timeout = self.timeout_s
        try:
            path = await asyncio.wait_for(_in_daemon_thread(ckpt.save, state["step"], write,
                                                            {"version": state["version"], "run_id": parts.run_id}), timeout)
        except asyncio.TimeoutError:
            raise CheckpointTimeout(
                f"the checkpoint of step {state['step']} was not written within {timeout:g} s "
                f"(training.checkpoint_timeout_s) under {ckpt.root}; a checkpoint is resumed from only once complete",
                "check that the checkpoint storage answers (`agentrl bench storage`); a large model on slow storage may "
                "need a larger training.checkpoint_timeout_s") from None
        self.state.checkpoints_written.append(path.name)
        return path.name


async def _in_daemon_thread(fn, *args):
    """`fn(*args)` in a daemon thread: one stuck on storage past its deadline must not keep the
    process from exiting (the event loop's own executor waits for its threads at the end)."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(outcome: str, value) -> None:
        if not future.done():
            getattr(future, outcome)(value)

    def run() -> None:
        try:
            result = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
            outcome, value = "set_exception", exc
        else:
            outcome, value = "set_result", result
        try:
            loop.call_soon_threadsafe(settle, outcome, value)
        except RuntimeError:  # the loop closed meanwhile: nobody waits any more
            pass
    threading.Thread(target=run, name="checkpoint-write", daemon=True).start()
    return await future


async def resume(parts, state, latest) -> None:
    """Restore the run (`parts`, `state`) from the checkpoint directory `latest` and bring the servers to its weights."""
    saved = await asyncio.to_thread(parts.backend.load_checkpoint, latest / "engine")
    state.step, state.version = int(saved["step"]), int(saved["version"])
    parts.sampler.load_state_dict(saved["sampler"])
    state.ledger = read_ledger(latest) or []
    set_rng_state(saved["rng"])
    await _reload_buffer(parts, saved.get("buffer", {}).get("pending", []))
    parts.controller.restore(saved.get("inflight", []))
    await reuse_stored(parts, state)
    state.resumed_from = latest.name
    await parts.publisher.sync_retrying(parts.backend, state.version)


async def reuse_stored(parts, state) -> None:
    """Let the rollout reuse this run's stored trajectories instead of storing a draw twice (after a
    resume, or a restart before the first checkpoint). The ones it may reuse (of draws not trained
    by the checkpoint and not back in the buffer) are read here, with the list of what is stored, so
    reusing one later needs no store that may have become unreachable meanwhile."""
    ids, reusable = await asyncio.to_thread(_stored, parts, state.ledger)
    parts.controller.stored_ids = ids
    parts.controller.fetch = lambda tid: reusable[tid] if tid in reusable else _fetch(parts, tid)


def _stored(parts, ledger: list[dict]) -> tuple[set[str], dict]:
    """(ids of this run's stored trajectories, trajectory id -> record of those the rollout may reuse)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from agentrl_cli.runtime.data.schema import TrajectoryRecord

    table = parts.writer.store.read_table((pc.field("run_id") == parts.run_id) & (pc.field("phase") == parts.phase))
    trained = pa.array([d["group_id"] for entry in ledger for d in entry["draws"]], pa.string())
    buffered = pa.array(parts.buffer.state_dict()["pending"], pa.string())
    candidates = table.filter(~pc.field("group_id").isin(trained) & ~pc.field("trajectory_id").isin(buffered))
    return (set(table.column("trajectory_id").to_pylist()),
            {row["trajectory_id"]: TrajectoryRecord.from_row(row) for row in candidates.to_pylist()})


def _fetch(parts, tid: str):
    from agentrl_cli.runtime.data.writer import find_trajectory

    return find_trajectory(parts.writer.store, tid)


async def _reload_buffer(parts, ids: list[str]) -> set[str]:
    """Put the checkpoint's untrained episodes back into the buffer, from the store; the ids found."""
    import pyarrow.compute as pc

    from agentrl_cli.runtime.data.writer import read_records
    from agentrl_cli.runtime.rollout.buffer import Episode
    from agentrl_cli.runtime.rollout.controller import version_number

    if not ids:
        return set()
    records = await asyncio.to_thread(read_records, parts.writer.store, pc.field("trajectory_id").isin(ids))
    for r in sorted(records, key=lambda r: ids.index(r.trajectory_id)):
        await parts.buffer.put(Episode(r.group_id, r, version_number(r.policy_version_first),
                                       parts.controller.reward_of_record(r)))  # generated before the resume
    return {r.trajectory_id for r in records}
