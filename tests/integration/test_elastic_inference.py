"""Elastic inference on real embedded servers on 127.0.0.1 (random tiny model):

- a server added to a running run with `agentrl run servers add` joins at the run's weights (verified;
  it never serves its launch weights) and serves within the first step after it joined; `remove`
  takes it out again;
- a server given SIGTERM drains: the generation in flight on it comes back with its partial tokens
  and finishes on the other server, token for token what one uninterrupted generation gives; new
  generation requests to a draining server get 503.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter

import httpx
import pytest

from agentrl_cli.config import load_config
from agentrl_cli.model.tiny import build_random
from agentrl_cli.engines.inference.client import InferenceClient, SamplingParams
from agentrl_cli.engines.embedded import hf_command
from agentrl_cli.engines.inference.launcher import launch, start_process, thread_env, wait_healthy
from agentrl_cli.engines.resume import ResumePolicy, generate_resumable
from agentrl_cli.run.training_run import training
from tests.conftest import free_port
from tests.integration.conftest import needs_bwrap
from tests.integration.test_supervisor import config, events, free_ports, until

pytestmark = pytest.mark.integration


@needs_bwrap
def test_a_server_added_mid_run_joins_at_the_runs_weights_and_serves_within_a_step(tmp_path, random_model_dir, cli):
    cfg = config(tmp_path, random_model_dir, **{"inference.replicas": 1, "rollout.mode": "sync"})
    run_dir = tmp_path / "run"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    served: list[tuple[str, str, int]] = []  # (server, weight version, run.step) of every generation

    async def go():
        async with training(cfg, run_dir, random_model_dir, run_id="el") as run:
            generate = run.client.generate

            async def recorded(*args, **kwargs):
                gen = await generate(*args, **kwargs)
                served.append((gen.server, gen.weight_version, run.step))
                return gen
            run.client.generate = recorded
            # another server of the same model, started elsewhere with its launch weights (version 0)
            cmd = hf_command(cfg.inference, str(random_model_dir), port, 5.0, cfg.model.dtype, cfg.model.context_length)
            extra = start_process("extra", cmd, url, tmp_path / "logs", thread_env(1))
            try:
                await asyncio.to_thread(wait_healthy, [extra], 120)
                assert url not in run.client.urls

                def add(row: dict) -> None:  # asked for while the run trains
                    if row["step"] == 1:
                        assert cli("run", "servers", "add", url, "--run", str(run_dir)).exit_code == 0
                await run.run(2, on_step=add)
                await until(lambda: events(run, "inference-1", "added"), "the added server to join")
                assert url in run.client.urls
                await run.run(3)
                listed = cli.json("run", "servers", "list", "--run", str(run_dir))[1]
                assert cli("run", "servers", "remove", url, "--run", str(run_dir)).exit_code == 0
                await until(lambda: events(run, "inference-1", "removed"), "the server to leave")
                assert url not in run.client.urls
                answered = run.client.answered[url]
                await run.run(4)
                async with httpx.AsyncClient() as http:
                    serving = (await http.get(url + "/get_model_info")).json()["weight_version"]
                return run, listed, answered, serving
            finally:
                extra.stop()
    run, listed, answered, serving = asyncio.run(go())
    added = events(run, "inference-1", "added")[0]
    assert added["url"] == url and int(added["weight_version"]) >= 1  # synced from its launch version 0
    mine = [(int(v), step) for server, v, step in served if server == url]
    assert mine, "the added server never served"
    assert min(step for _, step in mine) <= added["step"] + 1, "it did not serve within one step of joining"
    assert min(v for v, _ in mine) >= int(added["weight_version"]), "it served weights older than the run's"
    assert serving == "3"  # synced every step while in rotation, not after it left (step 4)
    assert run.client.answered[url] == answered, "it served after it was removed"
    entry = next(c for c in listed["components"] if c["url"] == url)
    assert entry["component"] == "inference-1" and entry["status"] == "up" and url in listed["rotation"]


def test_a_server_given_sigterm_hands_back_its_generation_which_finishes_on_another(tmp_path):
    cfg = load_config(None, [f"inference.port={free_ports(2)}", "inference.replicas=2", "inference.startup_timeout_s=120"],
                      env={}).config
    # wider than the tiny test model, which decodes 600 tokens in about 0.3 s here: A must still be
    # decoding when it is sent SIGTERM after 0.3 s of work (this one takes about 2 s)
    model = build_random(tmp_path / "m", seed=5, hidden_size=256, intermediate_size=768, num_hidden_layers=6,
                         tie_word_embeddings=False, initializer_range=0.2)  # and not one token repeated
    servers, urls = launch(cfg, str(model), tmp_path / "logs")
    a, b = servers
    prompt = [72, 101, 108, 108, 111, 32]
    sampling = SamplingParams(max_new_tokens=600, temperature=0.0, ignore_eos=True)

    async def busy_s(http: httpx.AsyncClient) -> float:
        return (await http.get(a.url + "/get_server_info")).json()["internal_states"][0]["busy_seconds_total"]

    async def go():
        reference_client = InferenceClient(b.url)
        client = InferenceClient(urls, max_retries=3, backoff_s=0.05)  # round robin: the first request goes to A
        try:
            reference = await reference_client.generate(prompt, sampling)
            counters: Counter = Counter()
            async with httpx.AsyncClient() as http:
                before = await busy_s(http)
                task = asyncio.create_task(generate_resumable(client, prompt, sampling, ResumePolicy(), counters))
                end = time.monotonic() + 60
                while await busy_s(http) - before < 0.3:  # A has decoded for a while: it holds partial tokens
                    assert time.monotonic() < end and not task.done(), "A never started decoding"
                    await asyncio.sleep(0.02)
            os.kill(a.proc.pid, signal.SIGTERM)
            gen = await task
            return reference, gen, counters
        finally:
            await client.close()
            await reference_client.close()
    try:
        reference, gen, counters = asyncio.run(go())
        a.proc.wait(timeout=30)  # drained, then exited
    finally:
        for s in servers:
            s.stop()
    pieces = gen.meta["pieces"]
    assert [p["server"] for p in pieces] == [a.url, b.url]
    assert pieces[0]["tokens"] > 0 and pieces[1]["tokens"] > 0 and sum(p["tokens"] for p in pieces) == 600
    assert counters["aborted_generations"] == 1 and counters["resumed_generations"] == 1 and counters["wasted_tokens"] == 0
    assert gen.finish_reason == "length" and gen.output_ids == reference.output_ids
    assert max(abs(x - y) for x, y in zip(gen.output_logprobs, reference.output_logprobs)) < 1e-3
    assert "draining: 1 request(s) in flight aborted" in a.log_path.read_text()


def test_a_draining_server_refuses_new_generations_and_reports_unhealthy(server):
    from agentrl_cli.engines.inference.hf_server import DRAINING

    app = server.app
    body = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 2}}
    assert httpx.post(server.url + "/generate", json=body, timeout=60).status_code == 200
    try:
        assert app.state.drain() == 0  # nothing in flight
        r = httpx.post(server.url + "/generate", json=body, timeout=60)
        assert r.status_code == 503 and DRAINING in r.json()["error"]["message"]
        chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        assert httpx.post(server.url + "/v1/chat/completions", json=chat, timeout=60).status_code == 503
        assert httpx.get(server.url + "/health", timeout=5).status_code == 503
        assert httpx.get(server.url + "/get_model_info", timeout=5).status_code == 200  # reads still answer
    finally:
        app.state.draining = False
