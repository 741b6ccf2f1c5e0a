"""StageContext: what a stage's `run(ctx)` gets - the resolved config, the run directory, the
options of this invocation and a progress callback. No global state; everything goes through it."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable, TypeVar

from agentrl_cli.config import LoadedConfig, PlatformConfig
from agentrl_cli.environment import short_environment
from agentrl_cli.report import Check, StageReport, guarded, stage_status
from agentrl_cli.rundir import RunDir, now_iso

T = TypeVar("T")


@dataclass
class StageOptions:
    strict: bool = False
    phase: str = "smoke"  # stage 8: smoke | short | full


@dataclass
class StageContext:
    loaded: LoadedConfig
    run: RunDir
    stage: int
    title: str
    options: StageOptions = field(default_factory=StageOptions)
    progress: Callable[[str], None] = lambda message: None
    started_at: str = field(default_factory=now_iso)
    _t0: float = field(default_factory=time.perf_counter)

    @property
    def config(self) -> PlatformConfig:
        return self.loaded.config

    @property
    def log(self) -> logging.Logger:
        return logging.getLogger(f"agentrl.stage{self.stage}")

    def check(self, name: str, fn: Callable[[], Check]) -> Check:
        """Run one check with containment: an exception becomes a failing check with its traceback."""
        self.progress(name)
        return guarded(name, fn)

    def produce(self, name: str, fn: Callable[[], tuple[Check, T]]) -> tuple[Check, T | None]:
        """Run a check that also produces what later checks need, with containment: `(check, value)`,
        or `(failing check, None)` when it raised. Later checks take the value as an argument."""
        self.progress(name)
        box: list = []

        def call() -> Check:
            check, value = fn()
            box.append(value)
            return check

        check = guarded(name, call)
        return check, (box[0] if box else None)

    def report(self, checks: list[Check], notes: list[str] | None = None, environment: dict | None = None) -> StageReport:
        """Build this stage's report from its checks (status, timing and run identity filled in)."""
        return StageReport(stage=self.stage, title=self.title, status=stage_status(checks), checks=list(checks),
                           started_at=self.started_at, duration_s=round(time.perf_counter() - self._t0, 3),
                           run_id=self.run.run_id, config_hash=self.loaded.hash,
                           environment={**short_environment(), **(environment or {})}, notes=list(notes or []))
