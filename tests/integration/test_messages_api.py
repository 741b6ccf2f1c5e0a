"""Anthropic's Messages API (`/v1/messages`) driven by the real `anthropic` SDK over loopback: on the
embedded server (random tiny model: the same text the chat completion of the same conversation
gets, the event stream in the documented order assembling to the same message), through a
recording gateway session over it (a two-call conversation recorded as one segment equal to the ids
/generate was sent and answered), and a tool loop (`tool_use` -> `tool_result`) whose tool call comes
from a scripted Backend, the openai_api seam, since a random model rarely writes one: parsed into
a `tool_use` block, streamed as `input_json_delta`, and recorded token-exact by a gateway.
Refusals name the field in the API's error shape; a bad key is an authentication_error. Streams are
written as generated: the first text delta of a 64-token message is read before the generation
finished and a client that leaves aborts it (the server's own counters), a gateway records the
streamed ids or, when the client left, nothing; a tool_use block is sent once the call is complete
and parsed; a server failing mid-stream ends it with an `error` event."""

from __future__ import annotations

import contextlib
import json
import re

import httpx
import openai
import pytest
from fastapi import FastAPI

from agentrl_cli.core.serving import ServerThread
from agentrl_cli.engines.gateway.app import create_app as gateway_app
from agentrl_cli.engines.gateway.service import Gateway
from agentrl_cli.engines.inference import create_app
from agentrl_cli.engines.messages_api import add_messages_routes
from agentrl_cli.engines.openai_api import Completion
from agentrl_cli.engines.openai_api.base import OpenAIError, TokenChunk
from agentrl_cli.model.chat import chat_format
from tests.integration.streaming import LEAVE_TOKENS, engine_counters, until
from tests.integration.test_gateway import ADMIN, Running, gateway_on, mismatches

anthropic = pytest.importorskip("anthropic", reason="the anthropic SDK is a test dependency: pip install anthropic")

pytestmark = [pytest.mark.integration]

LOOKUP = {"name": "lookup", "description": "Look a word up.",
          "input_schema": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}}
CALL_TEXT = '<tool_call>\n{"name": "lookup", "arguments": {"word": "gateway"}}\n</tool_call>'
HELLO = [{"role": "user", "content": "Say something."}]
ASK = [{"role": "user", "content": "What is a gateway?"}]
GREEDY = {"temperature": 0}  # the SDK takes sampling settings through extra_body


class ScriptedBackend:
    """An `openai_api.Backend` whose generations are its script's replies, each tokenized and closed
    with the end-of-turn token; it keeps (input ids, output ids, log-probs) of each, as served."""

    def __init__(self, tokenizer, script: list[str]) -> None:
        self.tokenizer, self.script, self.served = tokenizer, list(script), []
        self.end = chat_format(tokenizer).end_of_turn

    def model_name(self) -> str:
        return "scripted"

    async def generate(self, input_ids, sampling, *, n=1, top_logprobs=0) -> list[Completion]:
        out = self.tokenizer.encode(self.script.pop(0), add_special_tokens=False) + [self.end]
        logprobs = [-0.5 - 0.01 * i for i in range(len(out))]
        self.served.append((list(input_ids), out, logprobs))
        return [Completion(output_ids=out, output_logprobs=logprobs, finish_reason="stop", matched_stop=self.end,
                           weight_version="1")]


@pytest.fixture(scope="module")
def engine(random_model_dir):
    from agentrl_cli.engines.inference.engine import HFEngine

    engine = HFEngine(random_model_dir, batch_window_ms=5, weight_version="3")
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def server(engine):
    """The embedded server (overrides the integration conftest's, to share its engine with a keyed app)."""
    srv = ServerThread(create_app(engine), name="hf").start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def tokenizer(random_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(random_model_dir))


@pytest.fixture(scope="module")
def gw(server, tokenizer):
    with gateway_on(server, tokenizer) as running:
        yield running


@contextlib.contextmanager
def scripted_gateway(tokenizer, script: list[str]):
    backend = ScriptedBackend(tokenizer, script)
    gateway = Gateway(backend)
    srv = ServerThread(gateway_app(gateway, admin_key=ADMIN), name="scripted-gateway").start()
    try:
        yield Running(srv.url, gateway, backend)
    finally:
        srv.stop()


def sdk(base_url: str, api_key: str = "unused") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base_url, api_key=api_key, max_retries=0, timeout=120)


def session(gw) -> tuple[dict, anthropic.Anthropic]:
    s = gw.session()
    return s, sdk(s["base_url"].removesuffix("/v1"), s["api_key"])


RAW = {"message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta",
       "message_stop"}


def _events(stream) -> tuple[list[str], str, str]:
    """The raw events' types (messages.stream adds helper events of its own: left out), the text
    deltas and the input_json deltas, each concatenated."""
    kinds, text, partial = [], "", ""
    for ev in stream:
        if ev.type not in RAW:
            continue
        kinds.append(ev.type)
        if ev.type == "content_block_delta" and ev.delta.type == "text_delta":
            text += ev.delta.text
        elif ev.type == "content_block_delta" and ev.delta.type == "input_json_delta":
            partial += ev.delta.partial_json
    return kinds, text, partial


def _in_order(kinds: list[str]) -> bool:
    """message_start, then blocks (start, deltas, stop), then message_delta and message_stop."""
    if kinds[:1] != ["message_start"] or kinds[-2:] != ["message_delta", "message_stop"]:
        return False
    open_block = False
    for kind in kinds[1:-2]:
        if kind == "content_block_start" and not open_block or kind == "content_block_stop" and open_block:
            open_block = not open_block
        elif kind != "content_block_delta" or not open_block:
            return False
    return not open_block


def test_plain_text_is_the_chat_completions_text(server):
    msg = sdk(server.url).messages.create(model="m", max_tokens=12, system="You are terse.", messages=HELLO,
                                          extra_body=GREEDY)
    chat = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0).chat.completions.create(
        model="m", max_tokens=12, temperature=0, messages=[{"role": "system", "content": "You are terse."}, *HELLO])
    assert "".join(b.text for b in msg.content) == chat.choices[0].message.content
    assert msg.role == "assistant" and msg.type == "message" and msg.model == "m"
    assert msg.stop_reason == {"stop": "end_turn", "length": "max_tokens"}[chat.choices[0].finish_reason]
    assert msg.usage.input_tokens == chat.usage.prompt_tokens and msg.usage.output_tokens == chat.usage.completion_tokens
    assert re.fullmatch(r"msg_[0-9a-f]{32}", msg.id)


def test_the_stream_is_in_order_and_assembles_to_the_message(server):
    client = sdk(server.url)
    whole = client.messages.create(model="m", max_tokens=12, messages=HELLO, extra_body=GREEDY)
    with client.messages.stream(model="m", max_tokens=12, messages=HELLO, extra_body=GREEDY) as stream:
        kinds, text, _ = _events(stream)
        final = stream.get_final_message()
    assert _in_order(kinds), kinds
    assert kinds.count("content_block_delta") > 1 or len(text) <= 3  # a token's text at a time, not one blob
    assert text == "".join(b.text for b in whole.content) == "".join(b.text for b in final.content)
    assert (final.stop_reason, final.usage.output_tokens, final.usage.input_tokens) == \
        (whole.stop_reason, whole.usage.output_tokens, whole.usage.input_tokens)
    kinds, raw_text, _ = _events(client.messages.create(model="m", max_tokens=12, messages=HELLO, stream=True,
                                                        extra_body=GREEDY))
    assert _in_order(kinds) and raw_text == text


def test_a_tool_call_is_a_tool_use_block_and_streams_as_input_json(tokenizer):
    backend = ScriptedBackend(tokenizer, ["Let me look.\n" + CALL_TEXT] * 2)
    app = FastAPI()
    app.get("/health")(lambda: {})
    add_messages_routes(app, backend)
    srv = ServerThread(app, name="scripted").start()
    try:
        client = sdk(srv.url)
        msg = client.messages.create(model="m", max_tokens=64, messages=ASK, tools=[LOOKUP])
        kinds, text, partial = _events(client.messages.create(model="m", max_tokens=64, messages=ASK, tools=[LOOKUP],
                                                              stream=True))
    finally:
        srv.stop()
    assert msg.stop_reason == "tool_use" and [b.type for b in msg.content] == ["text", "tool_use"]
    assert msg.content[0].text == "Let me look." and re.fullmatch(r"toolu_[0-9a-f]{24}", msg.content[1].id)
    assert (msg.content[1].name, msg.content[1].input) == ("lookup", {"word": "gateway"})
    assert _in_order(kinds) and kinds.count("content_block_start") == 2, kinds
    assert text == "Let me look." and json.loads(partial) == {"word": "gateway"}


def test_a_tool_loop_through_a_gateway_is_recorded_token_exact(tokenizer):
    with scripted_gateway(tokenizer, [CALL_TEXT, "A door."]) as gw:
        s, client = session(gw)
        messages = list(ASK)
        first = client.messages.create(model="m", max_tokens=64, messages=messages, tools=[LOOKUP])
        (call,) = first.content
        messages += [{"role": "assistant", "content": first.content},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "a door"}]}]
        with client.messages.stream(model="m", max_tokens=64, messages=messages, tools=[LOOKUP]) as stream:
            streamed = "".join(stream.text_stream)
            second = stream.get_final_message()
        r = gw.admin("POST", f"/sessions/{s['session_id']}/reward", json={"reward": 0.5, "call_id": first.id})
        assert r.status_code == 200, r.text  # a per-call reward names the call by the id the agent saw
        record = gw.admin("DELETE", f"/sessions/{s['session_id']}").json()
    served = gw.client.served
    assert first.stop_reason == "tool_use" and call.input == {"word": "gateway"}
    assert second.stop_reason == "end_turn" and streamed == "A door." == second.content[0].text
    counters = record["counters"]
    assert counters["calls"] == 2 and counters["non_prefix_calls"] == 0 and len(record["segments"]) == 1, counters
    segment = record["segments"][0]
    assert mismatches(segment, served) == 0  # the stored ids are the ids served, generated ids loss-masked
    assert segment["logprobs"][len(served[1][0]):] == pytest.approx(served[1][2])
    steps = segment["calls"]
    assert [st["call_id"].replace("chatcmpl-", "msg_") for st in steps] == [first.id, second.id]
    assert steps[0]["tool_calls"][0]["id"].replace("call_", "toolu_") == call.id
    assert steps[0]["observation"] == [{"role": "tool", "tool_call_id": call.id, "content": "a door"}]
    assert [st["reward"] for st in steps] == [0.5, None]
    assert second.usage.input_tokens == len(served[1][0]) and second.usage.output_tokens == len(served[1][1])


def test_a_conversation_through_the_gateway_is_one_segment_of_the_served_ids(gw):
    s, client = session(gw)
    messages = list(ASK)
    first = client.messages.create(model="m", max_tokens=6, messages=messages, extra_body={"temperature": 0.7})
    messages += [{"role": "assistant", "content": first.content}, {"role": "user", "content": "And then?"}]
    with client.messages.stream(model="m", max_tokens=6, messages=messages, extra_body={"top_k": 20}) as stream:
        streamed = "".join(stream.text_stream)
    record = gw.admin("DELETE", f"/sessions/{s['session_id']}").json()
    assert record["counters"]["calls"] == 2 and len(record["segments"]) == 1, record["counters"]
    segment = record["segments"][0]
    assert mismatches(segment, gw.client.served[-2:]) == 0
    assert segment["calls"][1]["action_text"] == streamed


@pytest.mark.parametrize(("kwargs", "named"), [
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]}, "messages[0].content[0].type"),
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
    ({"extra_body": {"frequency_penalty": 1}}, "frequency_penalty"),
    ({"extra_body": {"temperature": 1.5}}, "temperature"),
])
def test_what_is_not_served_is_refused_naming_it(gw, kwargs, named):
    _, client = session(gw)
    args = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], **kwargs}
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(**args)
    assert info.value.body["type"] == "error" and info.value.body["error"]["type"] == "invalid_request_error"
    assert info.value.body["error"]["message"].startswith(named), info.value.body


def test_a_bad_key_is_an_authentication_error_on_the_gateway_and_the_server(gw, engine):
    mine, _ = session(gw)
    for key in ("agk-wrong", gw.session()["api_key"]):
        with pytest.raises(anthropic.AuthenticationError) as info:
            sdk(mine["base_url"].removesuffix("/v1"), key).messages.create(model="m", max_tokens=2, messages=ASK)
        assert info.value.body["error"]["type"] == "authentication_error"
    r = httpx.post(mine["base_url"] + "/messages", json={"model": "m", "max_tokens": 2, "messages": ASK})
    assert r.status_code == 401 and "x-api-key" in r.json()["error"]["message"]
    bearer = anthropic.Anthropic(base_url=mine["base_url"].removesuffix("/v1"), auth_token=mine["api_key"], max_retries=0)
    assert bearer.messages.create(model="m", max_tokens=2, messages=ASK).usage.output_tokens >= 1  # a bearer opens it too
    assert gw.admin("GET", "/stats").json()["gateway/unauthorized"] >= 3

    keyed = ServerThread(create_app(engine, api_key="sekret"), name="keyed").start()
    try:
        with pytest.raises(anthropic.AuthenticationError) as info:
            sdk(keyed.url, "wrong").messages.create(model="m", max_tokens=2, messages=ASK)
        assert info.value.body["error"]["type"] == "authentication_error"
        assert sdk(keyed.url, "sekret").messages.create(model="m", max_tokens=2, messages=ASK).usage.output_tokens >= 1
    finally:
        keyed.stop()


LONG = {"model": "m", "max_tokens": 64, "system": "You are terse.", "messages": HELLO, "extra_body": GREEDY}


@pytest.mark.parametrize("where", ["server", "gateway"])
def test_a_live_message_stream_leaves_as_generated_and_a_client_that_leaves_aborts_its_generation(server, gw, where):
    """The SDK reads the first text delta of a long message and leaves the stream: the inference
    server's own counters show the request aborted before its last token (so the delta left, and was
    read, before the generation finished), and a gateway session records no step of it, only
    `aborted_calls` (which masks the episode)."""
    s, client = session(gw) if where == "gateway" else (None, sdk(server.url))
    before, aborted = engine_counters(server.url), gw.gateway.stats()["gateway/aborted_calls"]
    with client.messages.stream(**{**LONG, "max_tokens": LEAVE_TOKENS}) as stream:
        first = next(e for e in stream if e.type == "content_block_delta")
    after = until(lambda: (c := engine_counters(server.url))["requests"] > before["requests"] and c,
                  "the aborted request to finish")
    assert first.delta.text and after["aborted"] == before["aborted"] + 1
    assert 1 <= after["tokens"] - before["tokens"] < LEAVE_TOKENS
    if s is not None:
        until(lambda: gw.gateway.stats()["gateway/calls_in_flight"] == 0, "the gateway to release the call")
        record = gw.admin("GET", f"/sessions/{s['session_id']}").json()
        assert record["segments"] == [] and record["counters"]["calls"] == 0 and record["counters"]["aborted_calls"] == 1
        assert gw.gateway.stats()["gateway/aborted_calls"] == aborted + 1


def test_a_whole_live_message_stream_is_the_message_not_streamed_and_is_recorded_as_streamed(server, gw):
    """Read to the end through a gateway session, token by token: the text, stop reason and usage
    equal the same request not streamed on the server, and the recorded ids are the ids streamed."""
    whole = sdk(server.url).messages.create(**LONG)
    s, client = session(gw)
    with client.messages.stream(**LONG) as stream:
        kinds, text, _ = _events(stream)
        final = stream.get_final_message()
    assert _in_order(kinds) and kinds.count("content_block_delta") > 8, kinds
    assert text == whole.content[0].text == final.content[0].text
    assert (final.stop_reason, final.usage.output_tokens) == (whole.stop_reason, whole.usage.output_tokens) == \
        ("max_tokens", 64)
    record = gw.admin("GET", f"/sessions/{s['session_id']}").json()
    (segment,) = record["segments"]
    (step,) = segment["calls"]
    assert step["call_id"].replace("chatcmpl-", "msg_") == final.id and step["action_text"] == text
    assert mismatches(segment, gw.client.served[-1:]) == 0 and final.usage.input_tokens == step["prompt_tokens"]


class StreamingBackend(ScriptedBackend):
    """The scripted backend streaming its tokens one at a time (`Backend.streams`); with `fail_after`
    set, the stream fails after that many tokens as a lost inference server does (503)."""

    streams = True
    fail_after: int | None = None

    async def generate_stream(self, input_ids, sampling, *, top_logprobs=0):
        (done,) = await self.generate(input_ids, sampling)

        async def chunks():
            for k, (tok, logprob) in enumerate(zip(done.output_ids, done.output_logprobs)):
                if k == self.fail_after:
                    raise OpenAIError("the inference server failed mid-stream", status=503, type="server_error")
                yield TokenChunk([tok], [logprob], "1")
            yield TokenChunk([], [], "1", done)
        return chunks()


def test_a_live_tool_call_is_sent_once_complete_and_parsed(tokenizer):
    """Text then a call, streamed as generated: the text deltas are the text before the call (no
    partial call text leaks), and the call is one tool_use block parsed by the model's format."""
    backend = StreamingBackend(tokenizer, ["Let me look.\n" + CALL_TEXT])
    app = FastAPI()
    app.get("/health")(lambda: {})
    add_messages_routes(app, backend)
    srv = ServerThread(app, name="streaming").start()
    try:
        with sdk(srv.url).messages.stream(model="m", max_tokens=64, messages=ASK, tools=[LOOKUP]) as stream:
            kinds, text, partial = _events(stream)
            final = stream.get_final_message()
    finally:
        srv.stop()
    assert _in_order(kinds) and kinds.count("content_block_start") == 2, kinds
    assert text == "Let me look." and kinds.index("content_block_stop") > 3  # the text came in several deltas
    assert json.loads(partial) == {"word": "gateway"} and final.stop_reason == "tool_use"
    assert [b.type for b in final.content] == ["text", "tool_use"] and final.content[1].input == {"word": "gateway"}


def test_a_live_stream_whose_server_fails_mid_way_ends_with_an_error_event_and_records_nothing(tokenizer):
    backend = StreamingBackend(tokenizer, ["A long answer that never ends."])
    backend.fail_after = 4
    gateway = Gateway(backend)
    srv = ServerThread(gateway_app(gateway, admin_key=ADMIN), name="failing-gateway").start()
    try:
        gw = Running(srv.url, gateway, backend)
        s = gw.session()
        body = {"model": "m", "max_tokens": 64, "messages": ASK, "stream": True}
        r = httpx.post(s["base_url"] + "/messages", json=body, headers={"x-api-key": s["api_key"]}, timeout=60)
        record = gw.admin("GET", f"/sessions/{s['session_id']}").json()
    finally:
        srv.stop()
    events = [json.loads(block.split("data: ", 1)[1]) for block in r.text.strip().split("\n\n")]
    assert [e["type"] for e in events][:2] == ["message_start", "content_block_start"]
    assert events[-1] == {"type": "error", "error": {"type": "overloaded_error",
                                                     "message": "the inference server failed mid-stream"}}
    assert record["segments"] == [] and record["counters"]["calls"] == 0 and record["counters"]["aborted_calls"] == 1
    assert gateway.stats()["gateway/failed_calls"] == 1 and gateway.stats()["gateway/calls_in_flight"] == 0
