"""The async inference client against real embedded servers on loopback: round robin and
least-loaded spreading, retries on a dead server, 4xx not retried, weight updates on every server;
and the launcher starting the embedded server as a process."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agentrl_cli.config import load_config
from agentrl_cli.engines.inference.client import InferenceClient, InferenceError, SamplingParams
from agentrl_cli.engines.inference.engine import HFEngine
from agentrl_cli.engines.inference.hf_server import create_app
from agentrl_cli.engines.inference.launcher import InferenceUnavailable, launch
from agentrl_cli.model.tiny import build_random
from agentrl_cli.core.serving import ServerThread

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return build_random(root / "a", seed=1), build_random(root / "b", seed=2)


@pytest.fixture
def two_servers(models):
    engines = [HFEngine(models[0], batch_window_ms=5) for _ in range(2)]
    servers = [ServerThread(create_app(e), name=f"hf-{i}").start() for i, e in enumerate(engines)]
    yield servers
    for s in servers:
        s.stop()
    for e in engines:
        e.close()


def test_generate_spreads_and_survives_a_dead_server(two_servers):
    async def go():
        client = InferenceClient([s.url for s in two_servers], backoff_s=0.01)
        gens = await asyncio.gather(*(client.generate([10, 20, 30], SamplingParams(max_new_tokens=4, temperature=0.0)) for _ in range(6)))
        assert {g.server for g in gens} == {s.url for s in two_servers}
        assert all(len(g.output_ids) == len(g.output_logprobs) > 0 and g.weight_version == "default" for g in gens)
        two_servers[1].stop()
        gens = [await client.generate([10, 20, 30], SamplingParams(max_new_tokens=4, temperature=0.0)) for _ in range(4)]
        assert {g.server for g in gens} == {two_servers[0].url}
        assert client.stats["retries"] >= 1 and not await client.health()
        with pytest.raises(InferenceError) as info:
            await client.generate([], SamplingParams(max_new_tokens=4))
        assert "HTTP 400" in info.value.message
        await client.close()
    asyncio.run(go())


def test_least_loaded_and_weight_updates_reach_every_server(two_servers, models):
    async def go():
        client = InferenceClient([s.url for s in two_servers], policy="least_loaded")
        before = await client.generate([5, 6, 7], SamplingParams(max_new_tokens=6, temperature=0.0))
        await client.update_weights_from_disk(str(models[1]), "v2")
        after = [await client.generate([5, 6, 7], SamplingParams(max_new_tokens=6, temperature=0.0)) for _ in range(2)]
        assert all(g.weight_version == "v2" and g.output_ids != before.output_ids for g in after)
        with pytest.raises(InferenceError):
            await client.update_weights_from_disk("/nonexistent/model", "v3")
        await client.close()
    asyncio.run(go())


def test_launcher_starts_the_embedded_server_and_refuses_missing_sglang(models, tmp_path):
    from tests.conftest import free_port

    cfg = load_config(None, [f"inference.port={free_port()}", "inference.startup_timeout_s=120"], env={}).config
    servers, urls = launch(cfg, str(models[0]), tmp_path / "logs")
    try:
        async def go():
            client = InferenceClient(urls)
            g = await client.generate([1, 2, 3], SamplingParams(max_new_tokens=3, temperature=0.0))
            await client.close()
            return g
        assert len(asyncio.run(go()).output_ids) == 3
        assert Path(servers[0].log_path).exists()
    finally:
        for s in servers:
            s.stop()
    assert not servers[0].alive()
    sg = load_config(None, ["inference.engine=sglang", f"inference.python={Path(__import__('sys').executable)}"], env={}).config
    with pytest.raises(InferenceUnavailable) as info:
        launch(sg, str(models[0]), tmp_path / "logs")
    assert "pip install" in info.value.hint and "inference.engine: hf" in info.value.hint


def test_seed_is_an_alias_of_sampling_seed(two_servers):
    import httpx

    url = two_servers[0].url
    body = {"input_ids": [3, 4, 5], "sampling_params": {"max_new_tokens": 8, "temperature": 1.0, "seed": 11}}
    a = httpx.post(f"{url}/generate", json=body, timeout=30).json()
    b = httpx.post(f"{url}/generate", json={**body, "sampling_params": {**body["sampling_params"], "seed": None, "sampling_seed": 11}}, timeout=30).json()
    assert a["output_ids"] == b["output_ids"]
    bad = httpx.post(f"{url}/generate", json={**body, "sampling_params": {"seed": 1, "sampling_seed": 2}}, timeout=30)
    assert bad.status_code == 400 and "seed" in bad.text
