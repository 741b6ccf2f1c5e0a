"""One harness's episodes played at the concurrency the run will play it at, before the run: as many
instances as episodes at once, built as the run builds them (`registry.create`), acting through the
run's per-harness warm sandbox pools (`HarnessSandboxes`: the harness's limits and image, at most its
`max_concurrency` or `sandbox.max_concurrency` alive), each playing the harness's scripted solutions
(plain actions where it ships none; every role's `scripted_move` for a multi-agent harness) and
scored by the harness itself where the run scores it so (`harnesses[].reward` harness or mix).

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

import os
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from agentrl_cli.acceptance import leftover_processes
from agentrl_cli.core.errors import EnvironmentBusy
from agentrl_cli.runtime.rollout.env_busy import FIRST_WAIT_S, MAX_WAIT_S


@dataclass
class Played:
    concurrency: int
    episodes: int = 0
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)
    backpressure: int = 0  # refusals at capacity, waited out
    given_up: int = 0  # episodes refused past rollout.env_busy_timeout_s
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
    fds = _fds()
    sandboxes = HarnessSandboxes(cfg)
    with leftover_processes.marked() as token:
        instances: list = []
        try:
            instances += [_instance(cfg, name, sandboxes) for _ in range(concurrency)]
            t0 = time.perf_counter()
            _play_all(cfg, name, tasks, instances, episodes, played)
            played.seconds = time.perf_counter() - t0
        finally:
            _close(instances)
            held = _leased(sandboxes, name)
            closed = sandboxes.close()
    played.leftovers = leftover_processes.leftovers(token)
    leftover_processes.end(played.leftovers)
    leaks = {"processes": len(played.leftovers), "sandbox_processes": closed.get("sandbox/leaked_processes"),
             "sandboxes_held": held, "dirs": closed.get("sandbox/leftover_dirs"), "fds": _fds_more(fds)}
    played.leaks = {k: v for k, v in leaks.items() if v is not None}
    return played


def _instance(cfg, name: str, sandboxes):
    from harnesses.defaults import WithDefaults
    from harnesses.registry import create, uses_sandboxes

    return WithDefaults(lambda: create(name, cfg, sandboxes=sandboxes.for_harness(name) if uses_sandboxes(name) else None))


def _close(instances: list) -> None:
    """Close every instance, at once (one may stop a server of its own), each even when another raised."""
    if not instances:
        return
    with ThreadPoolExecutor(min(len(instances), 16), thread_name_prefix="concurrency-close") as pool:
        closing = [pool.submit(h.close) for h in instances]
    errors = [f.exception() for f in closing if f.exception() is not None]
    if errors:
        raise errors[0]


def _leased(sandboxes, name: str) -> int | None:
    """The sandboxes the harness's pool still has leased (None: it has no pool here)."""
    provider = sandboxes.providers.get(name)
    metrics = getattr(getattr(provider, "inner", None), "metrics", None)
    return metrics()["in_use"] if metrics is not None else None


def _play_all(cfg, name: str, tasks: list, instances: list, episodes: int, played: Played) -> None:
    from harnesses.registry import reward_source

    hc = next(h for h in cfg.harnesses if h.name == name)
    scored = reward_source(hc) != "verifiers"  # the run asks the harness for its score while the episode is alive
    free: queue.Queue = queue.Queue()
    for h in instances:
        free.put(h)
    lock = threading.Lock()

    def one(i: int) -> None:
        h = free.get()
        task = tasks[i % len(tasks)]
        try:
            refused, given_up, failure = _episode(cfg, h, task, scored)
        except Exception as exc:  # noqa: BLE001 - counted as a failure, named
            refused, given_up, failure = 0, False, f"{task.task_id}: {type(exc).__name__}: {exc}"
        finally:
            free.put(h)
        with lock:
            played.episodes += 1
            played.backpressure += refused
            played.given_up += given_up
            if failure:
                played.failures.append(failure)

    with ThreadPoolExecutor(len(instances), thread_name_prefix=f"concurrency-{name}") as pool:
        list(pool.map(one, range(episodes)))


def _episode(cfg, h, task, scored: bool) -> tuple[int, bool, str]:
    """(refusals at capacity, given up, what failed or "") of one episode of `task` on `h`."""
    from harnesses.contract import play, scripted_policy, some_actions
    from harnesses.multi_agent import is_multi_agent, play_scripted

    r = cfg.rollout
    scripted = scripted_policy(h.inner)
    scripted = scripted if scripted is not None and scripted(task, 0) is not None else None
    started, refused = time.monotonic(), 0
    try:
        while True:
            try:
                if is_multi_agent(h) and hasattr(h, "scripted_move"):
                    traj = play_scripted(h, task)[0]
                else:
                    traj = play(h, task, policy=scripted or some_actions)[0]
                break
            except EnvironmentBusy as busy:  # backpressure: waited out as the rollout waits, never a failure
                refused += 1
                if time.monotonic() - started > r.env_busy_timeout_s:
                    return refused, True, ""
                wait = busy.retry_after_s if busy.retry_after_s is not None else (
                    (r.env_create_backoff_s or FIRST_WAIT_S) * 2 ** min(refused - 1, 16))
                time.sleep(min(max(wait, 0.0), MAX_WAIT_S))
        if scored and (scripted is not None or is_multi_agent(h)) and h.has_reward():
            reward = h.compute_reward(traj)
            if reward != 1.0:
                return refused, False, f"{task.task_id}: the scripted solution scored {reward:g}, not 1.0"
        return refused, False, ""
    finally:
        h.end_episode()


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
