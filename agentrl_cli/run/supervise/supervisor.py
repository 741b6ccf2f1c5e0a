"""The run's supervisor: it polls the health of the components the run depends on every
`observe.health_interval_s` and acts on what it sees.

- A component is down when its process exited, or after `DOWN_AFTER` health polls in a row failed
  (each with a short timeout). `on_down(component)` runs at once (the run takes an inference server
  out of the client's rotation).
- A component the run started (`restartable`) is restarted with exponential backoff (`backoff_s`,
  doubling), at most `max_restarts` times over the run. After a restart `on_up(component)` must
  succeed before it counts as back (the run syncs an inference server to its current weights and
  verifies them, then puts it back into rotation); a failure there counts as a failed restart.
- One the run did not start is only watched: out on `on_down`, back in (`on_up`) once healthy again.
- Past `max_restarts` the supervisor gives up on the component: `failed` holds `ComponentFailed`
  (its name, the cause, its last log lines, the fix), `wait_failed()` returns it, and the run raises
  it at its next step boundary (or while waiting for samples).
- `add(component)` / `remove(name)`: components joining and leaving a running run (elastic
  inference, `agentrl run servers`). An added component joins once it answers its health check and
  `on_up` succeeds ("added"); a removed one leaves at once ("removed").

Every transition is an entry of `events` ({"component", "event", "t", "cause", "seconds", ...}):
event one of down, restarting, restarted, back, gave_up, added, removed; `t` is seconds since the
supervisor was made, `seconds` how long the transition took (a restart's start-up, the time a
component was out). The counters it is given get `supervisor/restarts`, `supervisor/down` (times a
component went down) and `supervisor/down_now` (components not serving now), which the run puts in
its step rows.

Not here: what a component is and how it restarts (`component.py`), what the run does on down and up
(`run/training_run.py`), the control file (`control.py`).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import Awaitable, Callable

import aiohttp

from agentrl_cli.core.errors import AgentrlError
from agentrl_cli.runtime.observe import keys
from agentrl_cli.run.supervise.component import GATEWAY, INFERENCE, REWARD, SANDBOX, Component

log = logging.getLogger(__name__)

DOWN_AFTER = 2  # failed health polls in a row that make a running component down
MAX_BACKOFF_S = 60.0
FIXES = {
    INFERENCE: "read the server's log (<run>/logs/) for why it exits: out of memory (fewer inference.max_batch_size or "
               "a smaller model), a port taken by another process, a bad model path; raise supervisor.max_restarts "
               "on hosts where servers are preempted",
    REWARD: "read the reward service's log and check reward.service_url; `agentrl serve reward` starts one",
    SANDBOX: "read the sandbox service's log and check sandbox.service_url; `agentrl serve sandbox` starts one",
    GATEWAY: "read the run's log for the gateway's error; check that gateway.port is free",
}
FIX_OTHER = "read the component's log for why it exits; raise supervisor.max_restarts if it only needs more tries"


class ComponentFailed(AgentrlError):
    """A component of the run kept failing after `supervisor.max_restarts` restarts."""

    exit_code = 1

    def __init__(self, name: str, cause: str, log_tail: str, fix: str) -> None:
        tail = "\n".join(log_tail.strip().splitlines()[-20:])
        super().__init__(f"{name} kept failing: {cause}" + (f"\nits last log lines:\n{tail}" if tail else ""), fix)
        self.name, self.cause, self.log_tail, self.fix = name, cause, log_tail, fix


@dataclass(eq=False)
class _Watch:
    component: Component
    status: str = "up"  # up | down | restarting | joining | failed
    fails: int = 0  # failed health polls in a row
    restarts: int = 0
    out_since: float | None = None  # when it went down (or was asked to join)
    cause: str = ""
    task: asyncio.Task | None = None


async def _call(hook, *args):
    """Call a hook that may be a plain function or a coroutine function."""
    result = hook(*args)
    return await result if inspect.isawaitable(result) else result


def _why(exc: BaseException) -> str:
    text = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    return text.splitlines()[0][:300]


class Supervisor:
    def __init__(self, components: list[Component], *, interval_s: float = 2.0, max_restarts: int = 3,
                 backoff_s: float = 1.0, on_down: Callable[[Component], object] | None = None,
                 on_up: Callable[[Component], Awaitable[dict | None] | dict | None] | None = None,
                 counters: Counter | None = None, restart_deadline_s: float = 300.0,
                 on_tick: Callable[[], object] | None = None) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self.interval_s, self.max_restarts, self.backoff_s = interval_s, max_restarts, backoff_s
        self.health_timeout_s = max(0.2, min(2.0, interval_s))
        self.on_down, self.on_up, self.on_tick = on_down, on_up, on_tick
        self.counters = counters if counters is not None else Counter()
        self.restart_deadline_s = restart_deadline_s
        self.watches: dict[str, _Watch] = {}
        for c in components:
            if c.name in self.watches:
                raise ValueError(f"two components named {c.name!r}")
            self.watches[c.name] = _Watch(c)
        self.events: list[dict] = []
        self.failed: ComponentFailed | None = None
        self._failed = asyncio.Event()
        self._t0 = time.monotonic()
        self._loop_task: asyncio.Task | None = None
        self._http: aiohttp.ClientSession | None = None

    # ---- life -------------------------------------------------------------------------------------

    async def start(self) -> "Supervisor":
        """Start the components that are not running yet (waiting for their health), then watch all."""
        # aiohttp: no log line per poll (httpx logs every request at INFO)
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.health_timeout_s))
        for w in list(self.watches.values()):
            if w.component.restartable and not w.component.started():
                try:
                    await w.component.restart(self.restart_deadline_s)
                except Exception as exc:  # noqa: BLE001 - its first start failed: restarts follow
                    await self._down(w, f"its first start failed: {_why(exc)}")
        self._gauge()
        self._loop_task = asyncio.create_task(self._loop(), name="supervisor")
        return self

    async def stop(self) -> None:
        tasks = [t for t in [self._loop_task, *(w.task for w in self.watches.values())] if t is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - stopping; the run's outcome matters more
                pass
        self._loop_task = None
        if self._http is not None:
            await self._http.close()
            self._http = None

    def raise_if_failed(self) -> None:
        if self.failed is not None:
            raise self.failed

    async def wait_failed(self) -> ComponentFailed:
        await self._failed.wait()
        return self.failed

    # ---- elastic membership -------------------------------------------------------------------------

    def add(self, component: Component) -> None:
        """Watch `component` from now on; it joins once healthy and `on_up` succeeded ("added")."""
        if component.name in self.watches:
            raise ValueError(f"a component named {component.name!r} is supervised already")
        self.watches[component.name] = _Watch(component, status="joining", out_since=time.monotonic(),
                                              cause="joining")
        self._gauge()

    async def remove(self, name: str, cause: str = "removed") -> bool:
        """Stop watching the component `name` and take it out (`on_down`); False when there is none."""
        w = self.watches.pop(name, None)
        if w is None:
            return False
        if w.task is not None:
            w.task.cancel()
        if w.status != "joining":
            await self._hook(self.on_down, w.component)
        self._event(w.component, "removed", cause)
        self._gauge()
        return True

    def find(self, url: str) -> Component | None:
        url = url.rstrip("/")
        return next((w.component for w in self.watches.values() if w.component.url == url), None)

    def status(self) -> list[dict]:
        """One entry per component: its description, status and restarts so far."""
        return [{**w.component.describe(), "status": w.status, "restarts": w.restarts, "cause": w.cause}
                for w in self.watches.values()]

    # ---- watching -----------------------------------------------------------------------------------

    async def _loop(self) -> None:
        while True:
            try:
                await self._tick()
            except Exception:  # noqa: BLE001 - the supervisor must outlive its own bugs
                log.exception("supervisor tick failed")
            await asyncio.sleep(self.interval_s)

    async def _tick(self) -> None:
        if self.on_tick is not None:
            try:
                await _call(self.on_tick)
            except Exception:  # noqa: BLE001 - a bad control file must not stop the watching
                log.exception("supervisor: on_tick failed")
        watched = [w for w in self.watches.values() if w.status in ("up", "down", "joining")]
        await asyncio.gather(*(self._check(w) for w in watched))
        self._gauge()

    async def _check(self, w: _Watch) -> None:
        c = w.component
        if w.status == "up":
            code = c.exit_code()
            if code is not None:
                await self._down(w, f"its process exited with code {code}")
                return
            ok, why = await self._probe(c)
            w.fails = 0 if ok else w.fails + 1
            if w.fails >= DOWN_AFTER:
                code = await self._exit_within(c, self.interval_s) if c.restartable else None
                await self._down(w, f"its process exited with code {code}" if code is not None
                                 else f"{why} ({w.fails} health polls in a row)")
        elif (await self._probe(c))[0]:  # down and not ours to restart, or joining: back once healthy
            await self._bring_back(w)

    @staticmethod
    async def _exit_within(c: Component, grace_s: float) -> int | None:
        """`c`'s exit status if its process ends within `grace_s`: a killed server stops answering a
        little before the kernel reports its exit (under load, more than two polls before), and the
        event's cause should name the exit rather than the failed polls. None for one still running."""
        end = time.monotonic() + grace_s
        while (code := c.exit_code()) is None and time.monotonic() < end:
            await asyncio.sleep(0.01)
        return code

    async def _probe(self, c: Component) -> tuple[bool, str]:
        try:
            async with self._http.get(c.url + c.health_path) as r:
                return r.status == 200, f"{c.health_path} answered {r.status}"
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            return False, f"{c.health_path}: {type(exc).__name__}"

    async def _down(self, w: _Watch, cause: str) -> None:
        c = w.component
        w.status, w.fails, w.out_since, w.cause = "down", 0, time.monotonic(), cause
        self.counters[keys.SUPERVISOR_DOWN] += 1
        log.error("supervisor: %s is down: %s", c.name, cause)
        self._event(c, "down", cause)
        await self._hook(self.on_down, c)
        if c.restartable:
            w.status = "restarting"
            w.task = asyncio.create_task(self._restart(w), name=f"restart {c.name}")
        self._gauge()

    async def _restart(self, w: _Watch) -> None:
        c = w.component
        while True:
            if w.restarts >= self.max_restarts:
                self._give_up(w)
                return
            await asyncio.sleep(min(MAX_BACKOFF_S, self.backoff_s * 2 ** w.restarts))
            w.restarts += 1
            self.counters[keys.SUPERVISOR_RESTARTS] += 1
            self._event(c, "restarting", w.cause)
            t0 = time.monotonic()
            try:
                await c.restart(self.restart_deadline_s)
            except Exception as exc:  # noqa: BLE001 - any failure to start counts as a failed restart
                w.cause = f"restart {w.restarts} failed: {_why(exc)}"
                log.error("supervisor: %s: %s", c.name, w.cause)
                continue
            self._event(c, "restarted", w.cause, seconds=time.monotonic() - t0)
            if await self._bring_back(w):
                return

    async def _bring_back(self, w: _Watch) -> bool:
        """`on_up`, then the component is up again ("back", or "added" for one that joined)."""
        c = w.component
        try:
            details = await _call(self.on_up, c) if self.on_up is not None else None
        except Exception as exc:  # noqa: BLE001 - not back: a restart again, or the next health poll
            w.cause = f"bringing it back failed: {_why(exc)}"
            log.error("supervisor: %s: %s", c.name, w.cause)
            return False
        if self.watches.get(c.name) is not w:  # removed meanwhile: out it stays
            await self._hook(self.on_down, c)
            return False
        joined = w.status == "joining"
        out = time.monotonic() - w.out_since if w.out_since is not None else 0.0
        w.status, w.fails, w.task = "up", 0, None
        self._event(c, "added" if joined else "back", w.cause, seconds=out, **(details or {}))
        log.warning("supervisor: %s is %s after %.1f s", c.name, "in rotation" if joined else "back", out)
        self._gauge()
        return True

    def _give_up(self, w: _Watch) -> None:
        c = w.component
        w.status = "failed"
        cause = f"{w.cause}; gave up after {w.restarts} restart(s) (supervisor.max_restarts={self.max_restarts})"
        self._event(c, "gave_up", cause)
        log.error("supervisor: %s: %s", c.name, cause)
        if self.failed is None:
            self.failed = ComponentFailed(c.name, cause, c.log_tail(), FIXES.get(c.kind, FIX_OTHER))
        self._failed.set()
        self._gauge()

    async def _hook(self, hook, c: Component) -> None:
        if hook is None:
            return
        try:
            await _call(hook, c)
        except Exception:  # noqa: BLE001 - a hook's failure must not stop the supervision
            log.exception("supervisor: hook for %s failed", c.name)

    def _event(self, c: Component, event: str, cause: str = "", seconds: float | None = None, **extra) -> None:
        self.events.append({"component": c.name, "event": event, "t": round(time.monotonic() - self._t0, 3),
                            "cause": cause, "seconds": None if seconds is None else round(seconds, 3),
                            "url": c.url, **extra})

    def _gauge(self) -> None:
        self.counters[keys.SUPERVISOR_DOWN_NOW] = sum(w.status in ("down", "restarting", "failed")
                                                      for w in self.watches.values())


async def unless_failed(supervisor: Supervisor | None, awaitable):
    """`await awaitable`, or raise `ComponentFailed` as soon as `supervisor` (None: no supervisor)
    gives up on a component; `awaitable` is then cancelled."""
    if supervisor is None:
        return await awaitable
    if supervisor.failed is not None:
        if inspect.iscoroutine(awaitable):
            awaitable.close()  # never started
        raise supervisor.failed
    work = asyncio.ensure_future(awaitable)
    failed = asyncio.ensure_future(supervisor.wait_failed())
    try:
        await asyncio.wait({work, failed}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        failed.cancel()
        if not work.done():
            work.cancel()
            try:
                await work
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - given up on; the failure is what is raised
                pass
    if work.done() and not work.cancelled():
        return work.result()
    raise supervisor.failed
