"""`inference.router_url`: generation goes to the router, weight updates to each server behind it.

Three real HTTP servers on loopback (aiohttp) record the paths they are asked for: two stand for the
servers in `inference.urls`, one for the router in front of them. SGLang's router forwards
generation, not weight updates (its binary serves /generate and /workers, no /update_weights_*),
so a client that sent the updates to the router would leave the servers on their old weights.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict

import pytest
from aiohttp import web

from agentrl_cli.config.models import PlatformConfig
from agentrl_cli.engines.generation import SamplingParams
from agentrl_cli.engines.inference.client import client_from_config


async def _recording_server(seen: list[str]) -> tuple[web.AppRunner, str]:
    async def any_route(request: web.Request) -> web.Response:
        seen.append(request.path)
        if request.path == "/generate":
            return web.json_response({"text": "x", "output_ids": [5], "meta_info": {
                "finish_reason": {"type": "length"}, "output_token_logprobs": [[-0.5, 5, None]], "weight_version": "0"}})
        return web.json_response({"success": True, "message": "ok"})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", any_route)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}"


def test_generation_goes_to_the_router_and_weight_updates_to_every_server():
    async def scenario() -> dict[str, list[str]]:
        seen: dict[str, list[str]] = defaultdict(list)
        runners, urls = [], {}
        for name in ("server-a", "server-b", "router"):
            runner, url = await _recording_server(seen[name])
            runners.append(runner)
            urls[name] = url
        try:
            cfg = PlatformConfig.model_validate({"inference": {"urls": [urls["server-a"], urls["server-b"]],
                                                               "router_url": urls["router"]}})
            client = client_from_config(cfg, cfg.inference.urls)
            for _ in range(4):
                await client.generate([1, 2, 3], SamplingParams(max_new_tokens=1))
            await client.update_weights_from_disk("/tmp/weights", "1")
            await client.close()
        finally:
            for runner in runners:
                await runner.cleanup()
        return seen

    seen = asyncio.run(scenario())
    assert seen["router"].count("/generate") == 4
    assert "/generate" not in seen["server-a"] + seen["server-b"]
    assert any("update_weights_from_disk" in p for p in seen["server-a"])
    assert any("update_weights_from_disk" in p for p in seen["server-b"])
    assert not any("update_weights" in p for p in seen["router"])


def test_a_router_without_its_servers_is_refused_at_load():
    with pytest.raises(Exception, match="inference.urls is empty"):
        PlatformConfig.model_validate({"inference": {"router_url": "http://127.0.0.1:30010"}})
    with pytest.raises(Exception, match="not the router"):
        PlatformConfig.model_validate({"inference": {"urls": ["http://127.0.0.1:30010"], "router_url": "http://127.0.0.1:30010"}})
