"""The client and server-load measurement driven by the engine object, against the embedded server
on loopback: pause and resume through the engine's routes and modes, a route the engine names is
the one requested, and the load figures come from the engine's metric names."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest

from agentrl_cli.acceptance.verify.server_load import ServerLoad
from agentrl_cli.engines.embedded import EmbeddedEngine
from agentrl_cli.engines.inference.client import InferenceClient, InferenceError, SamplingParams

pytestmark = pytest.mark.integration


def test_pause_in_place_holds_a_generation_until_continue(server):
    async def go():
        client = InferenceClient(server.url, engine=EmbeddedEngine(), timeout_s=60)
        try:
            await client.pause_generation("in_place")
            task = asyncio.create_task(client.generate([1, 2, 3], SamplingParams(max_new_tokens=4, temperature=0.0)))
            await asyncio.sleep(1.0)
            held = not task.done()
            await client.continue_generation()
            g = await asyncio.wait_for(task, 60)
            return held, g
        finally:
            await client.close()

    held, g = asyncio.run(go())
    assert held and len(g.output_ids) == 4 and g.finish_reason == "length"


def test_a_pause_mode_the_engine_does_not_take_is_refused_naming_those_it_takes(server):
    class AbortOnly(EmbeddedEngine):
        title = "abort-only"
        capabilities = dataclasses.replace(EmbeddedEngine.capabilities, pause_modes=("abort",))

    async def go():
        client = InferenceClient(server.url, engine=AbortOnly())
        try:
            await client.pause_generation("in_place")
        finally:
            await client.close()

    with pytest.raises(InferenceError) as info:
        asyncio.run(go())
    assert "in_place" in info.value.message and "abort" in info.value.hint


def test_the_client_requests_the_route_its_engine_names(server):
    class Elsewhere(EmbeddedEngine):
        routes = dataclasses.replace(EmbeddedEngine.routes, generate="/not_generate")

    async def go(engine):
        client = InferenceClient(server.url, engine=engine, max_retries=0)
        try:
            return await client.generate([1, 2], SamplingParams(max_new_tokens=1))
        finally:
            await client.close()

    assert asyncio.run(go(EmbeddedEngine())).output_ids
    with pytest.raises(InferenceError) as info:
        asyncio.run(go(Elsewhere()))
    assert "HTTP 404" in info.value.message


def test_server_load_reads_the_engine_s_busy_counter_and_queue_gauge(server):
    load = ServerLoad(interval_s=0.1, engine=EmbeddedEngine()).start([server.url])

    async def go():
        client = InferenceClient(server.url)
        try:
            await asyncio.gather(*(client.generate([1, 2, 3], SamplingParams(max_new_tokens=16, ignore_eos=True))
                                   for _ in range(8)))
        finally:
            await client.close()

    asyncio.run(go())
    deadline = time.monotonic() + 30  # at least one sample of the queue gauge, even when the generations were quick
    while not load._queue and time.monotonic() < deadline:
        time.sleep(0.05)
    figures = load.stop()
    assert 0 < figures["server_busy_fraction"] <= 1 and figures["inference_queue_len_mean"] is not None
