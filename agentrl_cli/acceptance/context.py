"""StageContext: what a stage's `run(ctx) -> StageReport` gets - the resolved config, the run
directory, the options of this invocation and a progress callback - and the one way a stage runs
its checks. No global state; everything goes through it.

Every check runs contained: an exception becomes one failing check with its traceback, never a
crash. A check that computes what later checks need returns it beside its checks, `(check, value)`
(or `(checks, value)`), and `produce`/`aproduce` hand back `(checks, value)`, with value None when
it raised; later checks take the value as an argument. A stage that needs a config other than the
one it was given derives it with `derive`, which validates it as `--set` overrides are validated.

Belongs here: running checks and building the report. What a check measures belongs to the stage
module (or the library room it exercises).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping, TypeVar

from agentrl_cli.config import LoadedConfig, PlatformConfig
from agentrl_cli.core.environment import short_environment
from agentrl_cli.core.outcomes import Phase
from agentrl_cli.core.report import Check, CheckStatus, StageReport, guarded, stage_status
from agentrl_cli.core.rundir import RunDir, now_iso

T = TypeVar("T")
Produced = tuple["Check | list[Check]", T]


@dataclass
class StageOptions:
    strict: bool = False
    phase: Phase = Phase.SMOKE  # stage 8: one of outcomes.STAGE8_PHASES
    force: bool = False  # stage 8 full: run without a passing short and baseline of the same configuration (phase_order.py)


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
        """Run one check: an exception becomes a failing check named `name` with its traceback."""
        self.progress(name)
        return guarded(name, fn)

    def checks(self, name: str, fn: Callable[[], list[Check]]) -> list[Check]:
        """Run a probe that returns several checks: an exception becomes one failing check named `name`."""
        return self.produce(name, lambda: (fn(), None))[0]

    def produce(self, name: str, fn: Callable[[], Produced[T]]) -> tuple[list[Check], T | None]:
        """Run a check (or several) that also computes what later checks need: `fn` returns
        `(check or checks, value)`; this returns `(checks, value)`, or `([failing check], None)`
        when it raised."""
        self.progress(name)
        try:
            found, value = fn()
        except Exception as exc:  # noqa: BLE001 - containment is the point
            return [Check.crashed(name, exc)], None
        return _as_checks(name, found), value

    async def acheck(self, name: str, coro_fn: Callable[[], Awaitable[Check]]) -> Check:
        """`check` for a coroutine function: awaited, contained the same way."""
        self.progress(name)
        try:
            found = await coro_fn()
        except Exception as exc:  # noqa: BLE001 - containment is the point
            return Check.crashed(name, exc)
        return guarded(name, lambda: found)

    async def aproduce(self, name: str, coro_fn: Callable[[], Awaitable[Produced[T]]]) -> tuple[list[Check], T | None]:
        """`produce` for a coroutine function."""
        self.progress(name)
        try:
            found, value = await coro_fn()
        except Exception as exc:  # noqa: BLE001 - containment is the point
            return [Check.crashed(name, exc)], None
        return _as_checks(name, found), value

    def derive(self, overrides: Mapping[str, Any], origin: str) -> PlatformConfig:
        """This stage's config with dotted-key `overrides` ({"training.world_size": 1}) applied and
        validated as `--set` overrides are; a bad key or value raises ConfigError naming `origin`."""
        from agentrl_cli.config.load import with_overrides

        return with_overrides(self.config, overrides, origin) if overrides else self.config

    def report(self, checks: list[Check], notes: list[str] | None = None, environment: dict | None = None) -> StageReport:
        """Build this stage's report from its checks (status, timing and run identity filled in)."""
        return StageReport(stage=self.stage, title=self.title, status=stage_status(checks), checks=list(checks),
                           started_at=self.started_at, duration_s=round(time.perf_counter() - self._t0, 3),
                           run_id=self.run.run_id, config_hash=self.loaded.hash,
                           environment={**short_environment(), **(environment or {})}, notes=list(notes or []))


def _as_checks(name: str, found: Any) -> list[Check]:
    """A check function's result as a list of checks; anything else is a failing check."""
    if isinstance(found, Check):
        return [found]
    if isinstance(found, list) and found and all(isinstance(c, Check) for c in found):
        return found
    return [Check(name, CheckStatus.FAIL, repr(found), "a Check or a non-empty list of Checks",
                  "the check function returned no Check", "fix the stage module")]
