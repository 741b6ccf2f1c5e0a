"""The Responses API (`/v1/responses`) with the real `openai` SDK, on the embedded server and on a
recording gateway session: plain text from the random tiny model (equal to the chat completion of
the same messages), the documented events in order with deltas that add up to the text, a function
call and its output continued by `previous_response_id` and by sending the items back (one
token-exact segment, the stored call ids the served response ids), retrieval, and refusals naming
the field. Streams are written as generated: the first text delta of a 64-token response is read
before the generation finished and a client that leaves aborts it (the server's own counters), a
gateway records the streamed ids or, when the client left, nothing; a function call is sent once
complete and parsed; a server failing mid-stream ends it `response.failed`.

Function calls come from a scripted Backend (the seam both the server's routes and the gateway
serve from: a real tokenizer, fixed generated ids), so the model "emits" a call every time without
training one; everything above the Backend is the real code."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
from fastapi import FastAPI

from agentrl_cli.core.serving import ServerThread
from agentrl_cli.engines.gateway.app import create_app as gateway_app
from agentrl_cli.engines.gateway.service import Gateway
from agentrl_cli.engines.openai_api import Completion, add_openai_routes
from agentrl_cli.engines.openai_api.base import OpenAIError, TokenChunk
from agentrl_cli.model.chat import chat_format
from tests.integration.streaming import LEAVE_TOKENS, engine_counters, until
from tests.integration.test_gateway import ADMIN, gateway_on, mismatches

pytestmark = [pytest.mark.integration]

TOOLS = [{"type": "function", "name": "lookup", "description": "Look a word up.",
          "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}}]
CALL_TEXT = '<tool_call>\n{"name": "lookup", "arguments": {"word": "gateway"}}\n</tool_call>'
ORDER = ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
         "response.output_text.done", "response.content_part.done", "response.output_item.done"]


class ScriptedBackend:
    """A Backend whose model says the next scripted text (then "Fine."), ended by the end-of-turn
    token, cut at max_new_tokens; it keeps what it served as (input ids, output ids)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.script, self.served = tokenizer, [], []
        self.eot = chat_format(tokenizer).end_of_turn

    def model_name(self) -> str:
        return "scripted"

    async def generate(self, input_ids, sampling, *, n=1, top_logprobs=0):
        text = self.script.pop(0) if self.script else "Fine."
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.eot]
        limit = sampling.get("max_new_tokens") or len(ids)
        cut = len(ids) > limit
        ids = ids[:limit]
        self.served.append((list(input_ids), list(ids), []))
        return [Completion(ids, [-0.25] * len(ids), "length" if cut else "stop", None if cut else self.eot, "1")]


@pytest.fixture(scope="module")
def tokenizer(random_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(random_model_dir))


@pytest.fixture(scope="module")
def real(server, tokenizer):
    """The embedded server (random tiny model) and a gateway in front of it."""
    with gateway_on(server, tokenizer) as gw:
        yield gw


class Scripted:
    """The scripted backend behind the server's routes (with the recording hook) and behind a gateway."""

    def __init__(self, tokenizer) -> None:
        self.backend, self.hooked = ScriptedBackend(tokenizer), []
        app = FastAPI()
        app.get("/health")(lambda: {})

        async def hook(call):
            self.hooked.append(call)

        add_openai_routes(app, self.backend, on_call=hook)
        self.server = ServerThread(app, name="scripted").start()
        self.gateway = Gateway(self.backend)
        self.gateway_server = ServerThread(gateway_app(self.gateway, admin_key=ADMIN), name="scripted-gw").start()

    def session(self) -> dict:
        r = httpx.post(self.gateway_server.url + "/sessions", json={}, headers={"Authorization": f"Bearer {ADMIN}"})
        assert r.status_code == 200, r.text
        return r.json()

    def record(self, session: dict) -> dict:
        return httpx.get(f"{self.gateway_server.url}/sessions/{session['session_id']}",
                         headers={"Authorization": f"Bearer {ADMIN}"}).json()

    def close(self) -> None:
        self.server.stop()
        self.gateway_server.stop()


@pytest.fixture(scope="module")
def scripted(tokenizer):
    s = Scripted(tokenizer)
    yield s
    s.close()


def sdk(base_url: str, api_key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=60)


def real_client(real, server, where: str):
    """(SDK client, the session or None) on the embedded server or on a gateway session."""
    if where == "server":
        return sdk(f"{server.url}/v1"), None
    session = real.session()
    return sdk(session["base_url"], session["api_key"]), session


@pytest.mark.parametrize("where", ["server", "gateway"])
def test_a_plain_response_is_the_chat_completion_of_the_same_messages(real, server, where):
    client, session = real_client(real, server, where)
    r = client.responses.create(model="tiny-random", instructions="You are terse.", input="Say something.",
                                max_output_tokens=6, temperature=0)
    chat = client.chat.completions.create(model="tiny-random", max_tokens=6, temperature=0, messages=[
        {"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say something."}])
    assert r.object == "response" and r.id.startswith("resp_") and r.output[0].type == "message"
    assert r.output_text == chat.choices[0].message.content
    assert r.usage.input_tokens == chat.usage.prompt_tokens and r.usage.output_tokens == chat.usage.completion_tokens
    if chat.choices[0].finish_reason == "length":
        assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    else:
        assert r.status == "completed"
    assert client.responses.retrieve(r.id).output_text == r.output_text
    if session is not None:
        record = real.admin("GET", f"/sessions/{session['session_id']}").json()
        steps = [s for seg in record["segments"] for s in seg["calls"]]
        assert [s["call_id"] for s in steps][:1] == [r.id] and steps[0]["action_text"] == r.output_text
        assert mismatches(record["segments"][0], real.client.served[-2:-1]) == 0


@pytest.mark.parametrize("where", ["server", "gateway"])
def test_a_streamed_response_sends_the_documented_events_in_order(real, server, where):
    client, session = real_client(real, server, where)
    events = list(client.responses.create(model="tiny-random", input="Say something.", max_output_tokens=8,
                                          temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert [k for k in kinds if k != "response.output_text.delta"] == ORDER + [kinds[-1]]
    assert kinds[-1] in ("response.completed", "response.incomplete") and kinds.count("response.output_text.delta") >= 1
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == final.output_text == next(e.text for e in events if e.type == "response.output_text.done")
    assert final.usage.output_tokens > 0
    if session is not None:
        assert final.usage.output_tokens == len(real.client.served[-1][1])
        record = real.admin("GET", f"/sessions/{session['session_id']}").json()
        (step,) = record["segments"][0]["calls"]
        assert step["call_id"] == final.id and step["action_text"] == text
        assert mismatches(record["segments"][0], real.client.served[-1:]) == 0


def _function_call_turns(client, backend, follow):
    """A call of `lookup`, then its output sent back by `follow` ("previous" or "items")."""
    backend.script += [CALL_TEXT, "A gateway is a door."]
    first = client.responses.create(model="m", instructions="You look words up.", input="What is a gateway?",
                                    tools=TOOLS, max_output_tokens=64)
    (call,) = first.output
    assert first.status == "completed" and call.type == "function_call" and call.name == "lookup"
    assert json.loads(call.arguments) == {"word": "gateway"} and call.call_id.startswith("call_")
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "a door"}
    if follow == "previous":
        second = client.responses.create(model="m", instructions="You look words up.", previous_response_id=first.id,
                                         input=[result], tools=TOOLS, max_output_tokens=64)
    else:  # as the Agents SDK does: the whole conversation, the output items as they came back
        items = [{"role": "user", "content": "What is a gateway?"},
                 *[o.model_dump(exclude_none=True) for o in first.output], result]
        second = client.responses.create(model="m", instructions="You look words up.", input=items, tools=TOOLS,
                                         max_output_tokens=64)
    assert second.output_text == "A gateway is a door." and second.status == "completed"
    return first, second


@pytest.mark.parametrize("follow", ["previous", "items"])
def test_a_function_call_and_its_output_are_one_token_exact_segment_on_a_gateway(scripted, follow):
    session = scripted.session()
    before = len(scripted.backend.served)
    first, second = _function_call_turns(sdk(session["base_url"], session["api_key"]), scripted.backend, follow)
    posted = httpx.post(f"{scripted.gateway_server.url}/sessions/{session['session_id']}/reward",
                        json={"reward": 0.5, "call_id": second.id}, headers={"Authorization": f"Bearer {ADMIN}"})
    assert posted.status_code == 200, posted.text
    record = scripted.record(session)
    assert record["counters"]["calls"] == 2 and record["counters"]["non_prefix_calls"] == 0
    (segment,) = record["segments"]
    assert [s["call_id"] for s in segment["calls"]] == [first.id, second.id]
    assert [s["reward"] for s in segment["calls"]] == [None, 0.5]  # a per-call reward names the response
    assert segment["calls"][0]["tool_calls"][0]["name"] == "lookup"
    assert segment["calls"][0]["observation"] == [{"role": "tool", "tool_call_id": first.output[0].call_id,
                                                   "content": "a door"}]
    assert mismatches(segment, scripted.backend.served[before:]) == 0


def test_the_server_serves_function_calls_and_hands_the_hook_each_call_under_its_response_id(scripted):
    client = sdk(f"{scripted.server.url}/v1")
    before = len(scripted.hooked)
    first, second = _function_call_turns(client, scripted.backend, "previous")
    assert [c.response["id"] for c in scripted.hooked[before:]] == [first.id, second.id]
    assert scripted.hooked[-1].messages[-2]["tool_calls"][0]["function"]["name"] == "lookup"
    assert client.responses.delete(second.id) is None
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(second.id)


def test_a_streamed_function_call_sends_its_arguments_events(scripted):
    scripted.backend.script.append(CALL_TEXT)
    events = list(sdk(f"{scripted.server.url}/v1").responses.create(model="m", input="What is a gateway?", tools=TOOLS,
                                                                    stream=True))
    kinds = [e.type for e in events]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.function_call_arguments.delta", "response.function_call_arguments.done",
                     "response.output_item.done", "response.completed"]
    assert json.loads(events[4].arguments) == {"word": "gateway"} and events[2].item.type == "function_call"
    assert events[-1].response.output[0].call_id == events[5].item.call_id


@pytest.mark.parametrize("kwargs, param", [
    ({"extra_body": {"n": 2}}, "n"),
    ({"reasoning": {"effort": "high"}}, "reasoning"),
    ({"background": True}, "background"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": [{"type": "reasoning", "id": "rs_1", "summary": []}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]},
     "input[0].content[0].type"),
    ({"previous_response_id": "resp_unknown"}, "previous_response_id"),
    ({"text": {"format": {"type": "json_object"}}}, "text"),
])
def test_what_is_not_served_is_a_400_naming_the_field(scripted, kwargs, param):
    args = {"model": "m", "input": "hi", **kwargs}
    for client in (sdk(f"{scripted.server.url}/v1"), sdk(**_session_args(scripted))):
        with pytest.raises(openai.BadRequestError) as info:
            client.responses.create(**args)
        err = info.value
        assert err.param == param and err.type == "invalid_request_error", err.body
        assert param.split("[")[0].split(".")[0] in err.message


def _session_args(scripted) -> dict:
    session = scripted.session()
    return {"base_url": session["base_url"], "api_key": session["api_key"]}


def test_a_sessions_responses_are_its_own(scripted):
    mine, theirs = _session_args(scripted), _session_args(scripted)
    r = sdk(**mine).responses.create(model="m", input="hi")
    assert sdk(**mine).responses.retrieve(r.id).id == r.id
    with pytest.raises(openai.NotFoundError):
        sdk(**theirs).responses.retrieve(r.id)
    with pytest.raises(openai.BadRequestError) as info:
        sdk(**theirs).responses.create(model="m", input="more", previous_response_id=r.id)
    assert info.value.code == "previous_response_not_found"
    unkept = sdk(**mine).responses.create(model="m", input="hi", store=False)
    with pytest.raises(openai.NotFoundError):
        sdk(**mine).responses.retrieve(unkept.id)


def test_the_agents_sdk_runs_a_tool_loop_through_a_gateway_session(scripted):
    """The OpenAI Agents SDK (tests/agents/agents_sdk_agent.py, as its author wrote it) calls its
    function tool and answers: both calls one token-exact segment."""
    from tests.agents.agents_sdk_agent import run

    session = scripted.session()
    before = len(scripted.backend.served)
    scripted.backend.script += ['<tool_call>\n{"name": "count_characters", "arguments": {"text": "abc"}}\n</tool_call>',
                                "It has 3."]
    answer = asyncio.run(run({"prompt": "How long is abc?"}, session["base_url"], session["api_key"]))
    assert answer == "It has 3."
    record = scripted.record(session)
    (segment,) = record["segments"]
    assert record["counters"]["non_prefix_calls"] == 0 and len(segment["calls"]) == 2
    assert segment["calls"][0]["observation"][0]["content"] == "3"
    assert mismatches(segment, scripted.backend.served[before:]) == 0


@pytest.mark.parametrize("script", [CALL_TEXT, "Hello there."])
def test_responses_and_events_validate_against_the_openai_packages_own_types(scripted, script):
    """The SDK builds its objects without validating; validating the wire JSON against its types
    (openai.types.responses) catches a missing or mistyped field."""
    from pydantic import TypeAdapter
    from openai.types.responses import Response, ResponseStreamEvent

    body = {"model": "m", "input": "x", "tools": TOOLS, "include": ["message.output_text.logprobs"]}
    for stream in (False, True):
        scripted.backend.script.append(script)
        r = httpx.post(f"{scripted.server.url}/v1/responses", json={**body, "stream": stream}, timeout=60)
        assert r.status_code == 200, r.text
        if not stream:
            assert Response.model_validate(r.json()).status == "completed"
            continue
        events = [json.loads(block.split("data: ", 1)[1]) for block in r.text.strip().split("\n\n")]
        kinds = [TypeAdapter(ResponseStreamEvent).validate_python(e).type for e in events]
        assert kinds[0] == "response.created" and kinds[-1] == "response.completed"


LONG = {"model": "tiny-random", "instructions": "You are terse.", "input": "Say something.", "max_output_tokens": 64,
        "temperature": 0}


@pytest.mark.parametrize("where", ["server", "gateway"])
def test_a_live_response_leaves_as_generated_and_a_client_that_leaves_aborts_its_generation(real, server, where):
    """The SDK reads the first text delta of a long response and closes the stream: the inference
    server's own counters show the request aborted before its last token (so the delta left, and was
    read, before the generation finished), and a gateway session records no step of it, only
    `aborted_calls` (which masks the episode)."""
    client, session = real_client(real, server, where)
    before, aborted = engine_counters(server.url), real.gateway.stats()["gateway/aborted_calls"]
    stream = client.responses.create(stream=True, **{**LONG, "max_output_tokens": LEAVE_TOKENS})
    created = next(e for e in stream if e.type == "response.created").response
    first = next(e for e in stream if e.type == "response.output_text.delta")
    stream.close()
    after = until(lambda: (c := engine_counters(server.url))["requests"] > before["requests"] and c,
                  "the aborted request to finish")
    assert first.delta and after["aborted"] == before["aborted"] + 1 and 1 <= after["tokens"] - before["tokens"] < LEAVE_TOKENS
    if session is not None:
        until(lambda: real.gateway.stats()["gateway/calls_in_flight"] == 0, "the gateway to release the call")
        record = real.admin("GET", f"/sessions/{session['session_id']}").json()
        assert record["segments"] == [] and record["counters"]["calls"] == 0 and record["counters"]["aborted_calls"] == 1
        assert real.gateway.stats()["gateway/aborted_calls"] == aborted + 1
        with pytest.raises(openai.NotFoundError):  # nothing half-done is kept for previous_response_id either
            client.responses.retrieve(created.id)


def test_a_whole_live_response_through_a_gateway_is_recorded_from_exactly_the_ids_streamed(real, tokenizer):
    """Read to the end, token by token: the streamed text is the decode of the ids the server
    generated, which are the ids recorded; the response is stored once complete."""
    session = real.session()
    client = sdk(session["base_url"], session["api_key"])
    events = list(client.responses.create(stream=True, **LONG))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    final = events[-1].response
    (served,) = real.client.served[-1:]
    assert "".join(deltas) == final.output_text == tokenizer.decode(served[1]) and len(deltas) > 8
    assert (final.status, final.usage.output_tokens, len(served[1])) == ("incomplete", 64, 64)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert client.responses.retrieve(final.id).output_text == final.output_text
    record = real.admin("GET", f"/sessions/{session['session_id']}").json()
    (segment,) = record["segments"]
    (step,) = segment["calls"]
    assert step["call_id"] == final.id and step["action_text"] == final.output_text
    assert mismatches(segment, [served]) == 0


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


def test_a_live_function_call_is_sent_once_complete_and_parsed(tokenizer):
    """Text then a call, streamed as generated: the text deltas are the text before the call (no
    partial call text leaks), and the call is one function_call item parsed by the model's format."""
    backend = StreamingBackend(tokenizer)
    backend.script.append("Let me look.\n" + CALL_TEXT)
    app = FastAPI()
    app.get("/health")(lambda: {})
    add_openai_routes(app, backend)
    srv = ServerThread(app, name="streaming").start()
    try:
        events = list(sdk(f"{srv.url}/v1").responses.create(model="m", input="What is a gateway?", tools=TOOLS,
                                                            stream=True))
    finally:
        srv.stop()
    kinds = [e.type for e in events]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "Let me look." and kinds.count("response.output_text.delta") > 1
    assert [k for k in kinds if k != "response.output_text.delta"] == ORDER + [
        "response.output_item.added", "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed"]
    final = events[-1].response
    assert [o.type for o in final.output] == ["message", "function_call"] and final.output[0].id == events[2].item.id
    assert json.loads(final.output[1].arguments) == {"word": "gateway"}
    from pydantic import TypeAdapter
    from openai.types.responses import ResponseStreamEvent

    adapter = TypeAdapter(ResponseStreamEvent)  # the SDK builds its objects without validating: validate the wire
    assert [adapter.validate_python(e.model_dump(mode="json")).type for e in events] == kinds


def test_a_live_response_whose_server_fails_mid_way_ends_failed_and_is_not_stored(tokenizer):
    backend = StreamingBackend(tokenizer)
    backend.script.append("A long answer that never ends.")
    backend.fail_after = 4
    app = FastAPI()
    app.get("/health")(lambda: {})
    add_openai_routes(app, backend)
    srv = ServerThread(app, name="failing").start()
    try:
        events = list(sdk(f"{srv.url}/v1").responses.create(model="m", input="hi", stream=True))
        with pytest.raises(openai.NotFoundError):
            sdk(f"{srv.url}/v1").responses.retrieve(events[0].response.id)
    finally:
        srv.stop()
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"] and kinds[-1] == "response.failed"
    assert events[-1].response.status == "failed" and "failed mid-stream" in events[-1].response.error.message
