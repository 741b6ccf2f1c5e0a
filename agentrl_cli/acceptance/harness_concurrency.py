"""One harness's episodes played at the concurrency the run will play it at, before the run: as many
instances as episodes at once, built as the run builds them (`registry.create`), acting through the
run's per-harness warm sandbox pools (`HarnessSandboxes`: the harness's limits and image, at most its
`max_concurrency` or `sandbox.max_concurrency` alive), each playing the harness's scripted solutions
(plain actions where it ships none; every role's `scripted_move` for a multi-agent harness) and
scored by the harness itself where the run scores it so (`harnesses[].reward` harness or mix). The
instances are lent by the rollout's own pool and refusals waited out by the rollout's own code.

Counted: episodes, episodes/s, failures (an exception from the harness, a scripted episode scored
below 1.0), refusals at capacity (`EnvironmentBusy`: waited out with the rollout's backoff and
counted, never failures; an episode refused past `rollout.env_busy_timeout_s` is given up) and what
outlived the episodes once every instance closed: processes started meanwhile (`leftover_processes`,
then ended), processes left in destroyed sandboxes' cgroups, sandboxes still leased, sandbox work
directories, this process's file descriptors. With the sandbox service (`sandbox.service_url`) the
sandboxes' own leaks are the service's to count (its `/metrics`), not measured here.

Belongs here: playing and counting. Not here: the concurrency itself and the judgement (stage 5).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from agentrl_cli.acceptance import leftover_processes
from agentrl_cli.core.errors import EnvironmentBusy
from agentrl_cli.runtime.rollout.env_busy import EnvBusy


@dataclass
class Played:
    concurrency: int
    episodes: int = 0
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)
    backpressure: int = 0  # refusals at capacity, waited out
    given_up: int = 0  # episodes refused past rollout.env_busy_timeout_s
    capped_at: int | None = None  # the instances at once after a refusal named the environment's capacity
    leaks: dict = field(default_factory=dict)  # processes, sandbox_processes, sandboxes_held, dirs, fds: those measured
    leftovers: dict[int, str] = field(default_factory=dict)  # pid -> command line of the processes that outlived the episodes

    @property
    def per_s(self) -> float:
        return round(self.episodes / self.seconds, 1) if self.seconds > 0 else 0.0

    @property
    def clean(self) -> bool:
        return not self.failures and not self.given_up and not any(self.leaks.values())


def play_at(config, name: str, tasks: list, concurrency: int, episodes: int, root: Path) -> Played:
    """Play `episodes` episodes of harness `name` over `tasks`, `concurrency` at once, through warm
    pools whose sandboxes live under `root` (see the module docstring)."""
    from agentrl_cli.config.load import with_overrides
    from agentrl_cli.envs.sandbox.provider import HarnessSandboxes

    cfg = config if config.sandbox.service_url else with_overrides(
        config, {"sandbox.root_dir": str(root)}, "stage 5's play at the run's concurrency")
    played = Played(concurrency)
    _warm_up(cfg, name, tasks)
    fds = _fds()
    sandboxes = HarnessSandboxes(cfg)
    with leftover_processes.marked() as token:
        try:
            t0 = time.perf_counter()
            asyncio.run(_play_all(cfg, name, tasks, episodes, played, lambda: _instance(cfg, name, sandboxes)))
            played.seconds = time.perf_counter() - t0
        finally:
            held = _leased(sandboxes, name)
            closed = sandboxes.close()
    played.leftovers = leftover_processes.leftovers(token)
    leftover_processes.end(played.leftovers)
    leaks = {"processes": len(played.leftovers), "sandbox_processes": closed.get("sandbox/leaked_processes"),
             "sandboxes_held": held, "dirs": closed.get("sandbox/leftover_dirs"), "fds": _fds_more(fds)}
    played.leaks = {k: v for k, v in leaks.items() if v is not None}
    return played


def _warm_up(cfg, name: str, tasks: list) -> None:
    """One episode, alone and not counted, before the file descriptors are counted: what a harness opens
    once per process (a client's connection pool, a loaded library) is not a leak of its episodes."""
    from agentrl_cli.envs.sandbox.provider import HarnessSandboxes

    sandboxes = HarnessSandboxes(cfg)
    try:
        asyncio.run(_play_all(cfg, name, tasks[:1], 1, Played(1), lambda: _instance(cfg, name, sandboxes)))
    finally:
        sandboxes.close()


def _instance(cfg, name: str, sandboxes):
    from harnesses.defaults import WithDefaults
    from harnesses.registry import create, uses_sandboxes

    return WithDefaults(lambda: create(name, cfg, sandboxes=sandboxes.for_harness(name) if uses_sandboxes(name) else None))


async def _play_all(cfg, name: str, tasks: list, episodes: int, played: Played, make) -> None:
    """The episodes on instances lent by the rollout's own pool (`HarnessPool`, made on demand up to
    the concurrency) with the rollout's own waits at capacity (`EnvBusy`: counted, the pool capped at
    a capacity a refusal names); every instance closed at the end."""
    from agentrl_cli.runtime.observe import keys
    from agentrl_cli.runtime.rollout.controller import HarnessPool
    from harnesses.registry import reward_source

    hc = next(h for h in cfg.harnesses if h.name == name)
    scored = reward_source(hc) != "verifiers"  # the run asks the harness for its score while the episode is alive
    pool = HarnessPool(make, played.concurrency)
    ctrl = SimpleNamespace(config=cfg, counters=Counter(), harness_pool=lambda _: pool)  # what EnvBusy reads and counts
    loop = asyncio.get_running_loop()
    executor = ThreadPoolExecutor(played.concurrency, thread_name_prefix=f"concurrency-{name}"[:15])

    async def one(i: int) -> None:
        task, busy = tasks[i % len(tasks)], EnvBusy(ctrl, name)
        while True:
            h = await pool.acquire(loop, executor)
            refused, failure = None, ""
            try:
                failure = await loop.run_in_executor(executor, _episode, h, task, scored)
            except EnvironmentBusy as exc:  # backpressure, waited out as the rollout waits: never a failure
                refused = exc
            except Exception as exc:  # noqa: BLE001 - counted as a failure, named
                failure = f"{task.task_id}: {type(exc).__name__}: {exc}"
            finally:
                pool.release(h)
            if refused is None:
                break
            if not await busy.wait(refused):
                played.given_up += 1
                break
        played.episodes += 1
        if failure:
            played.failures.append(failure)

    try:
        await asyncio.gather(*(one(i) for i in range(episodes)))
    finally:
        idle, pool.idle = pool.idle, []
        played.failures += await loop.run_in_executor(executor, _close, idle)
        executor.shutdown(wait=True)
        played.backpressure = ctrl.counters[keys.env_backpressure(name)]
        played.capped_at = pool.limit if pool.limit < played.concurrency else None


def _episode(h, task, scored: bool) -> str:
    """One episode of `task` on `h`: what failed, or ""."""
    from harnesses.contract import play, scripted_policy, some_actions
    from harnesses.multi_agent import is_multi_agent, play_scripted

    scripted = scripted_policy(h.inner)
    scripted = scripted if scripted is not None and scripted(task, 0) is not None else None
    try:
        if is_multi_agent(h) and hasattr(h, "scripted_move"):
            traj = play_scripted(h, task)[0]
        else:
            traj = play(h, task, policy=scripted or some_actions)[0]
        if scored and (scripted is not None or is_multi_agent(h)) and h.has_reward():
            reward = h.compute_reward(traj)
            if reward != 1.0:
                return f"{task.task_id}: the scripted solution scored {reward:g}, not 1.0"
        return ""
    finally:
        h.end_episode()


def _close(instances: list) -> list[str]:
    """Close every instance, at once (one may stop a server of its own); what each close raised."""
    if not instances:
        return []
    with ThreadPoolExecutor(min(len(instances), 16), thread_name_prefix="concurrency-close") as pool:
        closing = [pool.submit(h.close) for h in instances]
    return [f"close: {type(exc).__name__}: {exc}" for exc in (f.exception() for f in closing) if exc is not None]


def _leased(sandboxes, name: str) -> int | None:
    """The sandboxes the harness's pool still has leased (None: it has no pool here)."""
    provider = sandboxes.providers.get(name)
    metrics = getattr(getattr(provider, "inner", None), "metrics", None)
    return metrics()["in_use"] if metrics is not None else None


def _fds_more(before: int, settle_s: float = 1.0) -> int:
    """File descriptors this process holds beyond `before`, once those closing have had `settle_s` to go
    (a server's end of a connection closes shortly after the client's)."""
    end = time.monotonic() + settle_s
    while True:
        more = max(0, _fds() - before)
        if not more or time.monotonic() >= end:
            return more
        time.sleep(0.05)


def _fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0
