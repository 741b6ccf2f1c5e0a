"""The embedded server's OpenAI-compatible API, driven by the real `openai` SDK over loopback: tool
calls parsed into `tool_calls` (from a tiny model trained here to make one, so the model really
emits it), streaming that equals the non-streamed text, chat log-probs equal to `/generate`'s for
the same ids, `n` choices, OpenAI-style 400s naming the field, the API key and weight version on
`/v1`, the recording hook, and the SGLang router sending `/v1/chat/completions` to two servers."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import httpx
import pytest
import torch
from fastapi import FastAPI
from transformers import AutoTokenizer

from agentrl_cli.engines.inference import HFEngine, create_app
from agentrl_cli.model.chat import chat_format, render
from agentrl_cli.model.tiny import init_model, save_model_dir
from agentrl_cli.engines.openai_api import EngineBackend, add_openai_routes
from agentrl_cli.core.serving import ServerThread
from tests.conftest import free_port
from tests.integration.streaming import LEAVE_TOKENS, LONG, engine_counters, first_content_then_leave, until

openai = pytest.importorskip("openai", reason="the openai SDK is a test dependency: pip install openai")

pytestmark = [pytest.mark.integration]

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
HELLO = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say something."}]


def metadata(obj) -> dict | None:
    """`metadata` of an SDK object (a declared field on some versions' types, an extra on others)."""
    return getattr(obj, "metadata", None) or (obj.model_extra or {}).get("metadata")


class Served:
    def __init__(self, model_dir, **app_kwargs) -> None:
        self.engine = HFEngine(model_dir, batch_window_ms=5, weight_version="7")
        self.server = ServerThread(create_app(self.engine, **app_kwargs), name="hf").start()
        self.url = self.server.url
        self.tok = AutoTokenizer.from_pretrained(model_dir)

    def client(self, api_key: str = "unused", **kwargs):
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=api_key, max_retries=0, timeout=120, **kwargs)

    def close(self) -> None:
        self.server.stop()
        self.engine.close()


@pytest.fixture(scope="module")
def served(random_model_dir):
    s = Served(random_model_dir)
    yield s
    s.close()


@pytest.fixture(scope="module")
def tool_model_dir(tmp_path_factory):
    """A tiny model trained (a few seconds) to answer ASK with WEATHER by a Hermes call: the prompt is
    `model.chat.render`'s, so the server emits the call only if it renders messages and tools that way."""
    model, tok = init_model(seed=0)
    prompt = tok.encode(render(tok, ASK, [WEATHER], True), add_special_tokens=False)
    target = tok.encode(CALL_TEXT, add_special_tokens=False) + [chat_format(tok).end_of_turn]
    ids = torch.tensor([prompt + target])
    labels = ids.clone()
    labels[0, :len(prompt)] = -100
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(300):
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() * len(target) < 0.3:  # every target token then has p > 0.74: greedy decoding writes the call
            break
    assert loss.item() * len(target) < 0.3, f"the tool-call model did not learn its one answer (loss {loss.item():.4f})"
    return save_model_dir(model.eval(), tok, tmp_path_factory.mktemp("tool-model") / "m", {"kind": "test-tool-call"})


@pytest.fixture(scope="module")
def tool_served(tool_model_dir):
    s = Served(tool_model_dir)
    yield s
    s.close()


def test_chat_with_tools_returns_the_models_call_parsed_into_tool_calls(tool_served):
    r = tool_served.client().chat.completions.create(model="m", messages=ASK, tools=[WEATHER], temperature=0,
                                                     max_tokens=64)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert re.fullmatch(r"call_[0-9a-f]{24}", call.id) and call.type == "function"
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    assert choice.message.content == "" and choice.model_extra["matched_stop"] is None
    assert r.id.startswith("chatcmpl-") and metadata(r) == {"weight_version": "7"}


def test_without_tools_the_same_text_is_content(tool_served):
    """tool_choice "none": the template sees no tools and nothing is parsed."""
    r = tool_served.client().chat.completions.create(model="m", messages=ASK, tools=[WEATHER], tool_choice="none",
                                                     temperature=0, max_tokens=64)
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason in ("stop", "length")


def test_a_named_tool_choice_opens_the_call_and_the_model_completes_it(tool_served):
    r = tool_served.client().chat.completions.create(
        model="m", messages=ASK, tools=[WEATHER], temperature=0, max_tokens=64,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    (call,) = r.choices[0].message.tool_calls
    assert json.loads(call.function.arguments) == {"city": "Paris"} and r.choices[0].finish_reason == "tool_calls"


def test_a_streamed_tool_call_assembles_to_the_same_call(tool_served):
    stream = tool_served.client().chat.completions.create(model="m", messages=ASK, tools=[WEATHER], temperature=0,
                                                          max_tokens=64, stream=True)
    calls, finish = {}, None
    for chunk in stream:
        for choice in chunk.choices:
            for tc in choice.delta.tool_calls or ():
                entry = calls.setdefault(tc.index, {"name": "", "arguments": ""})
                entry["name"] += tc.function.name or ""
                entry["arguments"] += tc.function.arguments or ""
            finish = choice.finish_reason or finish
    assert finish == "tool_calls" and list(calls) == [0]
    assert calls[0]["name"] == "get_weather" and json.loads(calls[0]["arguments"]) == {"city": "Paris"}


def test_a_call_the_assistant_prefill_opened_is_parsed_whatever_the_model_adds(served):
    """continue_final_message: the turn is read from its start, so the client's prefill and the
    random model's continuation are one turn."""
    prefill = [*ASK, {"role": "assistant", "content": CALL_TEXT}]
    r = served.client().chat.completions.create(model="m", messages=prefill, tools=[WEATHER], temperature=0,
                                                max_tokens=4, extra_body={"continue_final_message": True})
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}


def _streamed(client, **kwargs) -> tuple[list[str], str | None]:
    pieces, finish = [], None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for choice in chunk.choices:
            if choice.delta.content:
                pieces.append(choice.delta.content)
            finish = choice.finish_reason or finish
    return pieces, finish


@pytest.mark.parametrize("extra", [{}, {"stop": ["4"]}])
def test_streaming_yields_the_same_text_as_not_streaming_at_temperature_zero(served, extra):
    client = served.client()
    kwargs = dict(model="m", messages=HELLO, temperature=0, max_tokens=24, **extra)
    whole = client.chat.completions.create(**kwargs).choices[0]
    pieces, finish = _streamed(client, **kwargs)
    assert "".join(pieces) == whole.message.content and finish == whole.finish_reason
    assert len(pieces) > 1 or len(whole.message.content) <= 3  # a token at a time, not one blob
    if extra:
        assert "4" not in whole.message.content


def test_chat_logprobs_equal_generate_logprobs_for_the_same_ids(served):
    """Same prompt ids (rendered here by model.chat.render), same seed: the same tokens, and log-probs
    equal to /generate's within 1e-5."""
    r = served.client().chat.completions.create(model="m", messages=HELLO, temperature=0.8, seed=11, max_tokens=16,
                                                logprobs=True)
    prompt = served.tok.encode(render(served.tok, HELLO, None, True), add_special_tokens=False)
    stops = list(chat_format(served.tok).stop_ids)
    g = httpx.post(f"{served.url}/generate", timeout=120, json={
        "input_ids": prompt, "return_logprob": True, "return_text_in_logprobs": True,
        "sampling_params": {"temperature": 0.8, "sampling_seed": 11, "max_new_tokens": 16, "stop_token_ids": stops}}).json()
    served_lp = g["meta_info"]["output_token_logprobs"]
    chat_lp = r.choices[0].logprobs.content
    assert r.usage.prompt_tokens == len(prompt) and r.usage.completion_tokens == len(served_lp) == len(chat_lp)
    assert [e.token for e in chat_lp] == [served.tok.decode([t]) for _, t, _ in served_lp]
    assert max(abs(e.logprob - lp) for e, (lp, _, _) in zip(chat_lp, served_lp)) <= 1e-5


def test_n_4_returns_4_choices_sampled_separately(served):
    r = served.client().chat.completions.create(model="m", messages=HELLO, n=4, temperature=1.0, seed=3, max_tokens=8,
                                                logprobs=True)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert len({c.message.content for c in r.choices}) > 1  # seeds 3..6: four samples, not one copied
    assert r.usage.completion_tokens == sum(len(c.logprobs.content) for c in r.choices)
    again = served.client().chat.completions.create(model="m", messages=HELLO, n=4, temperature=1.0, seed=3,
                                                    max_tokens=8)
    assert [c.message.content for c in again.choices] == [c.message.content for c in r.choices]


@pytest.mark.parametrize("kwargs,param", [
    ({"logit_bias": {"12": 5}}, "logit_bias"),
    ({"extra_body": {"best_effort_mode": True}}, "best_effort_mode"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"logprobs": True, "top_logprobs": 3}, "top_logprobs"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
])
def test_an_unsupported_field_gets_an_openai_style_400_naming_it(served, kwargs, param):
    with pytest.raises(openai.BadRequestError) as info:
        served.client().chat.completions.create(**{"model": "m", "messages": HELLO, "max_tokens": 4, **kwargs})
    err = info.value
    assert err.status_code == 400 and err.param == param and param.split("[")[0] in err.message
    assert err.type == "invalid_request_error" and set(err.body) == {"message", "type", "param", "code"}


def test_a_prompt_longer_than_the_context_is_a_400(served):
    with pytest.raises(openai.BadRequestError) as info:
        served.client().chat.completions.create(model="m", messages=[{"role": "user", "content": "word " * 4000}],
                                                max_tokens=4)
    assert "context length" in info.value.message and info.value.code == "context_length_exceeded"


def test_completions_and_models_speak_the_sdk(served):
    client = served.client()
    (model,) = client.models.list().data
    assert model.id == served.engine.model_path and model.model_extra["max_model_len"] == served.engine.context_length
    r = client.completions.create(model="m", prompt="The cat", max_tokens=6, temperature=0, logprobs=0)
    ids = served.tok.encode("The cat")
    g = httpx.post(f"{served.url}/generate", timeout=120, json={
        "input_ids": ids, "return_logprob": True, "sampling_params": {"temperature": 0, "max_new_tokens": 6}}).json()
    assert r.choices[0].text == g["text"] and r.usage.prompt_tokens == len(ids)
    assert r.choices[0].logprobs.token_logprobs == pytest.approx([lp for lp, _, _ in g["meta_info"]["output_token_logprobs"]],
                                                                 abs=1e-5)
    streamed = "".join(c.choices[0].text for c in client.completions.create(model="m", prompt="The cat", max_tokens=6,
                                                                            temperature=0, stream=True) if c.choices)
    assert streamed == r.choices[0].text
    with pytest.raises(openai.BadRequestError) as info:  # top-k alternatives: the engine returns the sampled token's only
        client.completions.create(model="m", prompt="The cat", max_tokens=2, logprobs=2)
    assert info.value.param == "logprobs"


def test_the_weight_version_follows_updates(served):
    client = served.client()
    assert httpx.post(f"{served.url}/update_weight_version", json={"new_version": "v-next"}, timeout=30).status_code == 200
    try:
        r = client.chat.completions.create(model="m", messages=HELLO, max_tokens=2)
        assert metadata(r) == {"weight_version": "v-next"}
        chunks = list(client.chat.completions.create(model="m", messages=HELLO, max_tokens=2, stream=True))
        assert chunks and all(metadata(c) == {"weight_version": "v-next"} for c in chunks)
    finally:
        httpx.post(f"{served.url}/update_weight_version", json={"new_version": "7"}, timeout=30)


def test_the_api_key_covers_v1(random_model_dir):
    s = Served(random_model_dir, api_key="sekret")
    try:
        with pytest.raises(openai.AuthenticationError):
            s.client("wrong").chat.completions.create(model="m", messages=HELLO, max_tokens=2)
        assert s.client("sekret").chat.completions.create(model="m", messages=HELLO, max_tokens=2).choices
    finally:
        s.close()


def test_the_call_hook_sees_the_exact_ids_the_client_was_served(served):
    """add_openai_routes(on_call=...) hands a recording gateway the prompt ids and generated ids."""
    calls = []

    async def record(call):
        calls.append(call)

    app = FastAPI()
    app.get("/health")(lambda: {})
    add_openai_routes(app, EngineBackend(served.engine), on_call=record)
    server = ServerThread(app, name="hooked").start()
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=120)
        r = client.chat.completions.create(model="m", messages=HELLO, max_tokens=6, temperature=0, logprobs=True)
    finally:
        server.stop()
    (call,) = calls
    assert call.prompt_ids == served.tok.encode(render(served.tok, HELLO, None, True), add_special_tokens=False)
    assert [served.tok.decode([t]) for t in call.choices[0].output_ids] == [e.token for e in r.choices[0].logprobs.content]
    assert call.response["id"] == r.id and call.messages == HELLO


def _requests_total(url: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith("sglang:num_requests_total"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{url}/metrics has no sglang:num_requests_total")


def test_the_sglang_router_sends_chat_completions_to_both_servers(random_model_dir, tmp_path):
    pytest.importorskip("sglang_router", reason="the SGLang router package is not installed: pip install sglang-router")
    servers = [Served(random_model_dir) for _ in range(2)]
    port, log = free_port(), tmp_path / "router.log"
    with log.open("w") as out:
        router = subprocess.Popen([sys.executable, "-m", "sglang_router.launch_router", "--worker-urls",
                                   *[s.url for s in servers], "--policy", "round_robin", "--host", "127.0.0.1",
                                   "--port", str(port), "--prometheus-port", str(free_port()), "--log-level", "warn"],
                                  stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline, healthy = time.monotonic() + 60, set()
        while healthy != {s.url for s in servers}:
            assert router.poll() is None, f"the router exited: {log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, f"the router never listed both workers healthy: {log.read_text()[-2000:]}"
            try:
                workers = httpx.get(f"http://127.0.0.1:{port}/workers", timeout=2).json()["workers"]
                healthy = {w["url"] for w in workers if w["is_healthy"]}
            except (httpx.TransportError, ValueError, KeyError):
                time.sleep(0.1)  # poll interval while the router starts
        before = [_requests_total(s.url) for s in servers]
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=120)
        for i in range(4):
            r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"hi {i}"}],
                                               max_tokens=4, temperature=0)
            assert r.choices[0].message.content
        counts = [_requests_total(s.url) - b for s, b in zip(servers, before)]
        assert counts == [2, 2], counts
    finally:
        router.terminate()
        router.wait(timeout=30)
        for s in servers:
            s.close()


def test_a_stream_leaves_as_generated_and_a_client_that_leaves_aborts_its_generation(served):
    """The first content event of a long generation is read, then the client disconnects: the
    server's own counters show the request aborted with fewer tokens generated than asked for, so the event
    left the server (and was read) before the generation had finished, and the generation stopped."""
    before = engine_counters(served.url)
    first_content_then_leave(f"{served.url}/v1/chat/completions", {**LONG, "max_tokens": LEAVE_TOKENS})
    after = until(lambda: (c := engine_counters(served.url))["requests"] > before["requests"] and c,
                   "the aborted request to finish")
    assert after["aborted"] == before["aborted"] + 1
    assert 1 <= after["tokens"] - before["tokens"] < LEAVE_TOKENS


def test_a_whole_live_stream_equals_the_call_not_streamed(served):
    """Read to the end: the content arrives in many events, one log-prob entry per generated token,
    and the text, tokens and finish equal the same call not streamed."""
    kwargs = {k: v for k, v in LONG.items() if k not in ("stream", "ignore_eos")} | {"extra_body": {"ignore_eos": True}}
    whole = served.client().chat.completions.create(**kwargs).choices[0]
    pieces, entries, finish = [], [], None
    for chunk in served.client().chat.completions.create(stream=True, **kwargs):
        for choice in chunk.choices:
            pieces += [choice.delta.content] if choice.delta.content else []
            entries += choice.logprobs.content if choice.logprobs else []
            finish = choice.finish_reason or finish
    assert "".join(pieces) == whole.message.content and finish == whole.finish_reason == "length"
    assert [e.token for e in entries] == [e.token for e in whole.logprobs.content] and len(entries) == 64
    assert len(pieces) > 8  # token by token, not one blob at the end
