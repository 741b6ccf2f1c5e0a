"""LoRA serving parts that need no server: SGLang's launch flags for `training.lora` (the command
line is rendered, not run), the transport `training.weight_sync` names with and without LoRA, and
`lora_path` on /generate requests (parsed per prompt; sent by the client once an adapter is set)."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from agentrl_cli.config import load_config
from agentrl_cli.core.errors import ConfigError
from agentrl_cli.engines.inference.client import InferenceClient, SamplingParams, client_from_config
from agentrl_cli.engines.sglang import sglang_command
from agentrl_cli.engines.inference.protocol import ProtocolError, parse_generate
from agentrl_cli.weightsync.disk import DiskTransport
from agentrl_cli.weightsync.distributed import DistributedTransport
from agentrl_cli.weightsync.lora import LoraTransport
from agentrl_cli.weightsync.registry import make_transport


def _cfg(*sets: str):
    return load_config(None, list(sets), env={}).config


def _flag(cmd: list[str], name: str) -> list[str]:
    """The values after `name` up to the next flag."""
    i = cmd.index(name) + 1
    values = []
    while i < len(cmd) and not cmd[i].startswith("--"):
        values.append(cmd[i])
        i += 1
    return values


def test_sglang_gets_lora_flags_sized_by_training_lora():
    cfg = _cfg('training.lora={"rank": 16, "target_modules": ["q_proj", "v_proj"]}', "inference.engine=sglang")
    cmd = sglang_command(cfg.inference, "/models/m", 30000, cfg.training.lora)
    assert "--enable-lora" in cmd
    assert _flag(cmd, "--max-lora-rank") == ["16"]
    assert _flag(cmd, "--lora-target-modules") == ["q_proj", "v_proj"]
    defaults = _cfg("training.lora={}")
    cmd = sglang_command(defaults.inference, "/models/m", 30000, defaults.training.lora)
    assert _flag(cmd, "--max-lora-rank") == ["8"]
    assert _flag(cmd, "--lora-target-modules") == ["q_proj", "k_proj", "v_proj", "o_proj"]
    plain = _cfg()
    assert not any("lora" in part for part in sglang_command(plain.inference, "/models/m", 30000, plain.training.lora))
    wide = _cfg("training.lora={}", "inference.dp_size=2")
    with pytest.raises(ConfigError, match="inference.dp_size is 2") as info:
        sglang_command(wide.inference, "/models/m", 30000, wide.training.lora)
    assert "inference.replicas" in info.value.hint


def test_disk_with_lora_is_the_adapter_transport_and_distributed_stays_a_full_broadcast(tmp_path):
    urls = ["http://127.0.0.1:1"]
    for sets, expected in (((), DiskTransport), (("training.lora={}",), LoraTransport),
                           (("training.weight_sync=distributed",), DistributedTransport),
                           (("training.weight_sync=distributed", "training.lora={}"), DistributedTransport)):
        cfg = _cfg(*sets)
        client = client_from_config(cfg, urls)
        client.use_adapter("policy-from-an-earlier-run")
        assert type(make_transport(cfg, client, tmp_path)) is expected, sets
        assert client.adapter.name is None  # a run starts on the servers' base weights


class _Tok:
    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]


def test_lora_path_is_parsed_per_prompt():
    parsed = parse_generate({"input_ids": [[1, 2], [3]], "lora_path": ["a", None]}, _Tok(), 100, 64)
    assert [i.lora_path for i in parsed.items] == ["a", None]
    parsed = parse_generate({"input_ids": [[1, 2], [3]], "lora_path": "a", "sampling_params": {"n": 2}}, _Tok(), 100, 64)
    assert [i.lora_path for i in parsed.items] == ["a"] * 4
    assert parse_generate({"input_ids": [1]}, _Tok(), 100, 64).items[0].lora_path is None
    with pytest.raises(ProtocolError, match="lora_path: expected"):
        parse_generate({"input_ids": [1], "lora_path": ""}, _Tok(), 100, 64)


def test_the_client_sends_the_policy_adapter_and_clients_of_the_same_servers_share_it():
    async def main():
        seen: list[dict] = []

        async def generate(request):
            seen.append(await request.json())
            return web.json_response({"text": "", "output_ids": [7], "meta_info": {
                "finish_reason": {"type": "length"}, "weight_version": "3", "output_token_logprobs": [[-0.5, 7, None]]}})

        app = web.Application()
        app.router.add_post("/generate", generate)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        cfg = _cfg()
        rollout, gateway = client_from_config(cfg, [url]), client_from_config(cfg, [url + "/"])
        other = InferenceClient([url])
        try:
            await rollout.generate([1, 2], SamplingParams(max_new_tokens=1))
            rollout.use_adapter("policy-v000003")
            await gateway.generate([1, 2], SamplingParams(max_new_tokens=1))
            await other.generate([1, 2], SamplingParams(max_new_tokens=1))
            rollout.use_adapter(None)
            await gateway.generate([1, 2], SamplingParams(max_new_tokens=1))
        finally:
            for c in (rollout, gateway, other):
                await c.close()
            await runner.cleanup()
        return [body.get("lora_path") for body in seen]

    assert asyncio.run(main()) == [None, "policy-v000003", None, None]


def test_a_server_without_the_adapter_is_skipped_like_an_unreachable_one():
    """A restarted server has not been given the policy's adapter yet: SGLang's 400 for it sends the
    request to another server, and with none left the client reports the servers unreachable (the
    rollout then waits for them and re-syncs weights) instead of failing the episode."""
    from agentrl_cli.engines.inference.client import InferenceUnreachable

    async def main():
        async def restarted(request):
            return web.json_response({"error": {"message": "The following requested LoRA adapters are not loaded: "
                                                           "p\nLoaded adapters: []."}}, status=400)

        async def current(request):
            return web.json_response({"text": "", "output_ids": [7], "meta_info": {
                "finish_reason": {"type": "length"}, "weight_version": "3", "output_token_logprobs": [[-0.5, 7, None]]}})

        runners, urls = [], []
        for handler in (restarted, current):
            app = web.Application()
            app.router.add_post("/generate", handler)
            runner = web.AppRunner(app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            runners.append(runner)
            urls.append(f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}")
        both = InferenceClient(urls, backoff_s=0.0, max_retries=1)
        alone = InferenceClient(urls[:1], backoff_s=0.0, max_retries=1)
        both.use_adapter("p")
        alone.use_adapter("p")
        try:
            gen = await both.generate([1], SamplingParams(max_new_tokens=1))
            with pytest.raises(InferenceUnreachable, match="requested LoRA adapters are not loaded"):
                await alone.generate([1], SamplingParams(max_new_tokens=1))
        finally:
            for c in (both, alone):
                await c.close()
            for runner in runners:
                await runner.cleanup()
        return gen, urls

    gen, urls = asyncio.run(main())
    assert gen.server == urls[1] and gen.output_ids == [7]
