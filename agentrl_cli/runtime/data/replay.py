"""Replay: rebuild the harness a trajectory was recorded with, at the recorded version,
with the recorded task (from the task set at the recorded version) and seed, replay the recorded
actions, compare every observation (text and status) and report the first divergence with a diff.

A version mismatch (harness or task set) is reported before anything runs: replaying against
different code proves nothing. So is an image mismatch, and it refuses to replay (ImageMismatch, exit
2): a trajectory recorded in one image (its `image_digest`; "" = the host root) is never replayed in
another (the image the configured harness resolves to now); a trajectory stored before schema 4
recorded none and replays as before. A multi-agent episode's record holds the whole joint episode (each
step with the role that acted): replay plays every role's moves in order and checks, before each,
that the harness gives the move to the recorded role (field `role`). Reading the trajectory from the store belongs to the caller.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

from agentrl_cli.core.errors import AgentrlError
from agentrl_cli.core.outcomes import Outcome
from agentrl_cli.runtime.data.schema import TrajectoryRecord
from harnesses.base import Action


@dataclass
class Divergence:
    step: int  # -1: the initial observation (reset)
    field: str  # "text" | "status" | "done" | "version" | "role"
    recorded: str
    replayed: str
    diff: str = ""


@dataclass
class ReplayReport:
    trajectory_id: str
    harness: str
    harness_version: str
    steps_compared: int = 0
    divergence: Divergence | None = None
    notes: list[str] = field(default_factory=list)
    role: str | None = None  # the role whose record this is (a multi-agent episode; its steps are every role's)

    @property
    def ok(self) -> bool:
        return self.divergence is None

    def to_dict(self) -> dict:
        d = self.divergence
        return {"trajectory_id": self.trajectory_id, "harness": self.harness, "harness_version": self.harness_version,
                "role": self.role, "ok": self.ok, "steps_compared": self.steps_compared, "notes": self.notes,
                "divergence": None if d is None else {"step": d.step, "field": d.field, "recorded": d.recorded,
                                                      "replayed": d.replayed, "diff": d.diff}}


def _diff(recorded: str, replayed: str, step: int) -> str:
    return "".join(difflib.unified_diff(recorded.splitlines(keepends=True), replayed.splitlines(keepends=True),
                                        fromfile=f"recorded/step{step}", tofile=f"replayed/step{step}"))


def _task(record: TrajectoryRecord, platform_config=None):
    """The recorded task, from the harness's task set at the recorded version: its `harnesses[]`
    entry's (a tasks file, or the class's own with its options) when the config has one, else the
    class's own or the committed set."""
    from agentrl_cli.core.errors import NotFoundError
    from harnesses.task_sources import builtin_or_own, task_set

    hc = next((h for h in getattr(platform_config, "harnesses", ()) if h.name == record.harness), None)
    tasks = task_set(hc, platform_config.data) if hc is not None else builtin_or_own(record.harness)
    if record.task_set_version and record.task_set_version != tasks.version:
        raise NotFoundError(f"trajectory {record.trajectory_id} used task set {record.task_set_version} of {record.harness}; "
                            f"this install and config give {tasks.version}",
                            "replay with the config (harnesses[].tasks, options) and the versions the run used")
    for task in tasks.tasks:
        if task.task_id == record.task_id:
            return task
    raise NotFoundError(f"task {record.task_id} is not in the {record.harness} task set {tasks.version}",
                        "replay with the config the run used (--config), whose harnesses[] entry names its tasks")


def _replayable(record: TrajectoryRecord) -> None:
    """An agent's episode (a harness that plays itself) is not replayed by its harness: the
    observations came from the agent's own tools, which only the agent can run again."""
    from agentrl_cli.core.errors import UsageError
    from harnesses.registry import resolve

    if getattr(resolve(record.harness), "plays_itself", False):
        raise UsageError(f"trajectory {record.trajectory_id} is an episode of {record.harness}, whose agent produced its "
                         "observations with its own tools; the harness cannot replay them",
                         "re-run the agent on the task instead (its calls were recorded token-exact by the gateway)")


class ImageMismatch(AgentrlError):
    """The trajectory was recorded in another image than the one its harness would replay it in."""


def check_image(record: TrajectoryRecord, platform_config) -> None:
    """ImageMismatch, naming both digests and the fix, when `record` ran in another image than the
    one its harness's `harnesses[]` entry in `platform_config` resolves to now."""
    from harnesses.images import describe, task_image

    if record.image_digest is None:  # stored before schema 4: not recorded
        return
    now = task_image(record.harness, platform_config, record.task_id)  # a Harbor task's built image, else the harness's
    if now.digest == record.image_digest:
        return
    fix = (f"set harnesses[{record.harness}].image to the image the run used (its meta.json names it under "
           f"harnesses[].image) so it resolves to {record.image_digest}" if record.image_digest else
           f"unset harnesses[{record.harness}].image (the episode ran on the host's root filesystem)")
    raise ImageMismatch(f"trajectory {record.trajectory_id} ran in {describe(record.image_digest)}, but "
                        f"{record.harness} would replay it in {describe(now.digest)}"
                        + (f" ({now.ref})" if now.ref and now.digest else ""),
                        fix + ", or replay with the config the run used (--config)")


def replay(record: TrajectoryRecord, harness=None, task=None, platform_config=None) -> ReplayReport:
    """Replay `record`. `harness` defaults to one built by the registry from `platform_config` (as the
    run built it); pass your own to replay against modified code (the version check then uses its
    `version`; its image is the caller's to choose, so only a harness built here is checked for it)."""
    report = ReplayReport(record.trajectory_id, record.harness, record.harness_version, role=record.role)
    _replayable(record)
    own = harness is None
    if own:
        check_image(record, platform_config)
        from harnesses.registry import create

        harness = create(record.harness, platform_config)
    try:
        if getattr(harness, "version", None) != record.harness_version:
            report.divergence = Divergence(-1, "version", record.harness_version, str(harness.version),
                                           f"recorded with {record.harness} {record.harness_version}, "
                                           f"installed {harness.version}: install the recorded version to replay")
            return report
        task = task or _task(record, platform_config)
        obs = harness.reset(task)
        if obs.text != record.initial_observation:
            report.divergence = Divergence(-1, "text", record.initial_observation, obs.text,
                                           _diff(record.initial_observation, obs.text, -1))
            return report
        for step in record.steps:
            if step.role is not None and hasattr(harness, "to_move"):
                mover = harness.to_move()
                if mover != step.role:
                    report.divergence = Divergence(step.index, "role", step.role, str(mover), f"- {step.role}\n+ {mover}\n")
                    return report
            obs = harness.step(Action(text=step.action))
            report.steps_compared += 1
            for name, rec, got in (("text", step.observation, obs.text), ("status", step.observation_status, obs.status)):
                if rec != got:
                    report.divergence = Divergence(step.index, name, rec, got,
                                                   _diff(rec, got, step.index) if name == "text" else f"- {rec}\n+ {got}\n")
                    return report
        if record.steps and not obs.done and record.outcome not in (Outcome.TRUNCATED, Outcome.TIMEOUT):
            report.notes.append("the replayed episode did not end where the recorded one did")
        return report
    finally:
        if own:
            harness.close()
