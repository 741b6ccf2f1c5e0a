"""An environment server at capacity is backpressure: each refusal is counted, the harness's pool is
capped at the capacity the refusal names, and an episode refused past rollout.env_busy_timeout_s is
given up masked, never as a harness error."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from types import SimpleNamespace

from agentrl_cli.core.errors import EnvironmentBusy
from agentrl_cli.runtime.rollout.controller import HarnessPool
from agentrl_cli.runtime.rollout.env_busy import EnvBusy


class Instance:
    closed = 0

    def close(self) -> None:
        Instance.closed += 1


def controller(timeout_s: float = 600.0, backoff_s: float = 0.0):
    pool = HarnessPool(Instance, 8)
    rollout = SimpleNamespace(env_busy_timeout_s=timeout_s, env_create_backoff_s=backoff_s)
    return SimpleNamespace(config=SimpleNamespace(rollout=rollout), counters=Counter(), harness_pool=lambda name: pool), pool


def test_a_refusal_naming_capacity_1_is_counted_and_caps_the_pool_closing_idle_instances_past_it():
    ctrl, pool = controller()

    async def go():
        loop = asyncio.get_running_loop()
        held = [await pool.acquire(loop, None) for _ in range(3)]
        for h in held:
            pool.release(h)
        assert len(pool.idle) == 3
        assert await EnvBusy(ctrl, "openenv").wait(EnvironmentBusy("at capacity", capacity=1))
    Instance.closed = 0
    asyncio.run(go())
    assert pool.limit == 1 and len(pool.idle) == 1 and Instance.closed == 2
    assert ctrl.counters["env/openenv/backpressure"] == 1 and ctrl.counters["env/openenv/capacity"] == 1
    assert not any("harness_errors" in k for k in ctrl.counters)


def test_a_capped_pool_lends_its_one_instance_in_turn():
    _, pool = controller()
    pool.cap(1)

    async def go():
        loop = asyncio.get_running_loop()
        first = await pool.acquire(loop, None)
        second = asyncio.ensure_future(pool.acquire(loop, None))
        await asyncio.sleep(0.02)
        assert not second.done()  # waits for the one session
        pool.release(first)
        assert await asyncio.wait_for(second, 1) is first
    asyncio.run(go())


def test_the_wait_doubles_from_env_create_backoff_s_and_gives_up_past_env_busy_timeout_s():
    ctrl, _ = controller(timeout_s=5.0, backoff_s=0.01)
    busy = EnvBusy(ctrl, "openenv")
    t0 = time.monotonic()
    assert asyncio.run(busy.wait(EnvironmentBusy("busy"))) and asyncio.run(busy.wait(EnvironmentBusy("busy")))
    assert 0.03 <= time.monotonic() - t0 < 1.0  # 0.01 s, then 0.02 s
    busy.started -= 10  # refused for longer than env_busy_timeout_s
    assert asyncio.run(busy.wait(EnvironmentBusy("busy"))) is False
    assert ctrl.counters["env/openenv/backpressure"] == 3


def test_openenvs_refusal_names_the_capacity_and_http_429_or_503_with_retry_after_is_busy():
    import httpx
    import pytest

    from harnesses.adapters.openenv import _capacity_named, _raise_if_busy

    assert _capacity_named("Server error: Server at capacity: 1/1 sessions active. Cannot accept new connections. "
                           "(code: CAPACITY_REACHED)") == 1
    assert _capacity_named("Server error: session failed (code: CAPACITY_REACHED)") is None
    with pytest.raises(EnvironmentBusy) as busy:
        _raise_if_busy(httpx.Response(503, headers={"Retry-After": "2"}))
    assert busy.value.retry_after_s == 2.0
    with pytest.raises(EnvironmentBusy):
        _raise_if_busy(httpx.Response(429))
    _raise_if_busy(httpx.Response(503))  # no Retry-After: an outage, not backpressure
    _raise_if_busy(httpx.Response(200))
